"""A V100 PROJECTION (not a measurement) of the AWQ M1 op, built from its sm_70 build.

    python scripts/sm70_projection.py [--json] [--latency-us 0.6] [--clock-mhz 1380]

What it does, with no GPU and no nvcc:
1. compiles the op's device code for compute_70 with the CUDA 12.8 NVRTC from PyPI, exactly as
   the CI gate does (qpnserve.kernels.sm70_gate.compile_ptx), and the read-floor kernel
   (csrc/bench_floor.cu, its device part) the same way;
2. assembles both with ptxas 12.8 (-arch=sm_70 -O3 -v): registers, shared memory, spills;
3. disassembles the cubin with the cuobjdump 12.8 bundled in the triton 3.3.x wheel (CUDA 13
   tools refuse sm_70): download it once into a git-ignored folder,
       pip download triton==3.3.1 --no-deps -d build/triton
       (cd build/triton && unzip -o triton-*.whl 'triton/backends/nvidia/bin/*')
   or point QPNSERVE_CUOBJDUMP at any cuobjdump that reads sm_70;
4. counts SASS instructions by kind per 32 weights, the most global loads (and bytes) a thread
   has outstanding at once, and V100 occupancy; then applies Little's law and V100
   issue rates to project each kernel's time.

Everything V100-specific below is an assumption, named, with its source; the output says
PROJECTION on every line that carries a projected time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qpnserve.kernels import sm70_gate  # noqa: E402  (after the path setup above)

# --- V100 facts and assumptions ----------------------------------------------------------
V100_SMS = 80
V100_READ_GB_S = 850.0  # measured read ceiling of a V100-PCIe (contract section 6, notes 1.2)
V100_REGS_PER_SM = 65536
V100_MAX_WARPS_PER_SM = 64
V100_MAX_BLOCKS_PER_SM = 32
V100_SMEM_PER_SM = 96 * 1024
V100_ISSUE_PER_SM_CLK = 4  # 4 schedulers, one warp instruction each per clock
# Warp instructions per clock per SM, by pipe, from the CUDA C++ Programming Guide's throughput
# table for cc 7.x (results per clock per SM / 32 lanes): FP32 64, FP16 128 results (= 64 half2
# lanes), 32-bit integer add/logic 64, conversions 16. LSU at 32 lanes/clk and the tensor rate
# (512 FP16 FMA/clk/SM, so one m8n8k4 of a warp = 1024 FMA = 2 clocks) are [unverified] leads.
PIPE_RATE = {
    "fp32": 2.0,
    "fp16x2": 2.0,
    "int": 2.0,
    "conv": 0.5,
    "mufu": 0.5,
    "lsu": 1.0,
    "hmma": None,  # handled by FMA count
}
HMMA_FMA_PER_CLK_SM = 512

KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("load_global", r"^(LDG|LD)\b"),
    ("load_shared", r"^LDS\b"),
    ("store", r"^(STG|STS|ST|RED|ATOM)\b"),
    ("hmma", r"^HMMA\b"),
    ("hfma2", r"^(HFMA2|HADD2|HMUL2)\b"),
    ("lop3", r"^LOP3\b"),
    ("prmt_shift", r"^(PRMT|SHF|SHL|SHR)\b"),
    ("conversion", r"^(F2F|I2F|F2I|I2I|F2FP)\b"),
    ("fp32", r"^(FFMA|FADD|FMUL|FMNMX|FSETP|FSEL)\b"),
    ("int_addr", r"^(IMAD|IADD3|LEA|ISETP|IABS|SEL|MOV|IMNMX|SGXT)\b"),
    ("mufu", r"^MUFU\b"),
    ("shuffle", r"^SHFL\b"),
    (
        "control",
        r"^(BRA|EXIT|BAR|BSSY|BSYNC|WARPSYNC|NOP|RET|CALL|BMOV|YIELD|DEPBAR|S2R|CS2R|"
        r"S2UR|ULDC|UMOV|R2UR|UIADD3|ULEA|USHF|MEMBAR|ERRBAR|CCTL)\b",
    ),
)
PIPE_OF_KIND = {
    "load_global": "lsu",
    "load_shared": "lsu",
    "store": "lsu",
    "hfma2": "fp16x2",
    "lop3": "int",
    "prmt_shift": "int",
    "conversion": "conv",
    "fp32": "fp32",
    "int_addr": "int",
    "mufu": "mufu",
    "shuffle": "lsu",
}


@dataclass
class KernelLaunch:
    """How the launcher runs a kernel (from csrc/: grid sizes are not in the binary)."""

    label: str
    name_expr: str
    grid_ctas: int
    weights_per_call: int  # 4-bit weights this kernel dequantizes per call (0: floor)
    bytes_per_call: int  # bytes it streams from memory per call


OP_LAUNCHES = {
    "4byte": (
        KernelLaunch(
            "w13_swiglu (A)", "qpn::w13_swiglu_kernel<false, true>", 100, 8_192_000, 10 * 512_000
        ),
        KernelLaunch(
            "w2_combine (B)", "qpn::w2_combine_kernel<false, true>", 80, 4_096_000, 10 * 256_000
        ),
    ),
    "3byte": (
        KernelLaunch(
            "w13_swiglu (A)", "qpn::w13_swiglu_kernel<true, true>", 100, 8_192_000, 10 * 486_400
        ),
        KernelLaunch(
            "w2_combine (B)", "qpn::w2_combine_kernel<true, true>", 80, 4_096_000, 10 * 243_200
        ),
    ),
}


def floor_launch(fmt: str, loads: int) -> KernelLaunch:
    from qpnserve.benchop.route_bytes import floor_chunks_per_route, route_bytes

    return KernelLaunch(
        f"read_floor L{loads}",
        f"qpnserve_floor::read_floor_m1_kernel<{loads}, false>",
        floor_chunks_per_route(fmt, loads) * 10,  # type: ignore[arg-type]
        0,
        route_bytes(fmt).per_call,  # type: ignore[arg-type]
    )


@dataclass
class KernelProjection:
    label: str
    mangled: str
    registers: int
    smem_bytes: int
    spill_bytes: int
    threads_per_block: int
    grid_ctas: int
    blocks_per_sm_limit: int
    occupancy_warps: int
    sass_total: int
    kinds: dict[str, int]
    per_32_weights: dict[str, float]
    loads_in_flight: int
    bytes_in_flight_per_thread: int
    bytes_in_flight_per_sm: float
    bytes_in_flight_needed_per_sm: float
    issue_us: float
    pipe_us: dict[str, float]
    memory_us: float
    latency_bound_us: float
    projected_us: float
    limiter: str


@dataclass
class Projection:
    fmt: str
    nvrtc: str
    ptxas: str
    cuobjdump: str
    latency_us: float
    clock_mhz: float
    kernels: list[KernelProjection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- compile ------------------------------------------------------------------------------


def nvrtc_ptx(
    source: Path, name_exprs: list[str], defines: list[str]
) -> tuple[str, dict[str, str]]:
    """NVRTC (the same library and options as the gate) for compute_70 -> (PTX, lowered names)."""
    return sm70_gate.nvrtc_compile(source.read_bytes(), source.name, name_exprs, "70", defines)


def ptxas(ptx: str, workdir: Path, stem: str) -> tuple[Path, str]:
    exe = sm70_gate._nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    ptx_path = workdir / f"{stem}.ptx"
    cubin = workdir / f"{stem}.cubin"
    ptx_path.write_text(ptx)
    done = subprocess.run(
        [str(exe), "-arch=sm_70", "-O3", "-v", "-o", str(cubin), str(ptx_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ptxas failed:\n{done.stderr}")
    return cubin, done.stdout + done.stderr


def find_cuobjdump() -> Path:
    candidates = [
        os.environ.get("QPNSERVE_CUOBJDUMP", ""),
        str(ROOT / "build/triton/triton/backends/nvidia/bin/cuobjdump"),
    ]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise SystemExit(
        "no cuobjdump that reads sm_70: pip download triton==3.3.1 --no-deps -d build/triton && "
        "(cd build/triton && unzip -o triton-*.whl 'triton/backends/nvidia/bin/*')"
    )


def sass_by_function(cubin: Path, cuobjdump: Path) -> dict[str, list[str]]:
    """Mangled name -> SASS opcodes+operands, one per instruction (control words dropped)."""
    text = subprocess.run(
        [str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = functions.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and current is not None:
            current.append(m.group(1).strip())
    return functions


# --- SASS analysis (pure) ----------------------------------------------------------------


def opcode(instr: str) -> str:
    """'@!P0 LDG.E.128.SYS R4, [R2]' -> 'LDG.E.128.SYS'."""
    parts = instr.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def kind_of(instr: str) -> str:
    op = opcode(instr)
    for kind, pattern in KIND_PATTERNS:
        if re.match(pattern, op):
            return kind
    return "other"


def count_kinds(instrs: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ins in instrs:
        k = kind_of(ins)
        counts[k] = counts.get(k, 0) + 1
    return counts


def _load_width_bytes(op: str) -> int:
    for width, nbytes in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1)):
        if width in op:
            return nbytes
    return 4


def _dest_regs(instr: str) -> set[str]:
    """Registers a global load writes (R4 with .128 -> R4..R7)."""
    parts = instr.split()
    if parts[0].startswith("@"):
        parts = parts[1:]
    first = parts[1].rstrip(",") if len(parts) > 1 else ""
    m = re.match(r"R(\d+)", first)
    if not m:
        return set()
    base, n = int(m.group(1)), _load_width_bytes(parts[0]) // 4 or 1
    return {f"R{base + i}" for i in range(n)}


def max_loads_in_flight(instrs: list[str]) -> tuple[int, int]:
    """(global loads, bytes) a thread has outstanding at most, walking the SASS in order.

    A load is outstanding from its issue until an instruction reads one of its destination
    registers; loads are assumed to complete in issue order, so that read retires every earlier
    load too. Branches are ignored (straight-line reading of the listing).
    """
    pending: list[tuple[set[str], int]] = []  # (destination registers, bytes), issue order
    best_count = best_bytes = 0
    for ins in instrs:
        op = opcode(ins)
        if op.startswith("LDG"):
            pending.append((_dest_regs(ins), _load_width_bytes(op)))
            count, nbytes = len(pending), sum(b for _, b in pending)
            if nbytes > best_bytes:
                best_count, best_bytes = count, nbytes
            continue
        operands = ins.split(",", 1)[1] if "," in ins else ""
        read = set(re.findall(r"\bR\d+\b", operands))
        for i in range(len(pending) - 1, -1, -1):
            if pending[i][0] & read:
                del pending[: i + 1]
                break
    return best_count, best_bytes


def occupancy(registers: int, threads: int, smem: int) -> tuple[int, int]:
    """(blocks per SM, resident warps per SM) on a V100 (registers allocated per warp in 256s)."""
    warps_per_block = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = (V100_REGS_PER_SM // regs_per_warp) // warps_per_block
    by_warps = V100_MAX_WARPS_PER_SM // warps_per_block
    by_smem = V100_SMEM_PER_SM // smem if smem else V100_MAX_BLOCKS_PER_SM
    blocks = max(0, min(by_regs, by_warps, by_smem, V100_MAX_BLOCKS_PER_SM))
    return blocks, blocks * warps_per_block


def project_kernel(
    launch: KernelLaunch,
    mangled: str,
    report: sm70_gate.KernelReport,
    threads: int,
    instrs: list[str],
    latency_us: float,
    clock_mhz: float,
) -> KernelProjection:
    kinds = count_kinds(instrs)
    blocks_limit, _ = occupancy(report.registers, threads, report.smem_bytes)
    blocks_per_sm = min(blocks_limit, math.ceil(launch.grid_ctas / V100_SMS))
    warps_resident = blocks_per_sm * math.ceil(threads / 32)
    n_loads, bytes_thread = max_loads_in_flight(instrs)
    in_flight_sm = bytes_thread * threads * blocks_per_sm
    needed_sm = V100_READ_GB_S * 1e3 * latency_us / V100_SMS  # bytes (GB/s * us = kB)
    total_threads = launch.grid_ctas * threads
    weights_per_thread = launch.weights_per_call / total_threads if launch.weights_per_call else 0
    per32 = (
        {k: v / (weights_per_thread / 32) for k, v in kinds.items()} if weights_per_thread else {}
    )
    # Static SASS count x warps in the grid: an upper bound (divergent tails counted in full).
    warp_instrs = len(instrs) * launch.grid_ctas * math.ceil(threads / 32)
    clock_per_us = clock_mhz
    active_sms = min(V100_SMS, launch.grid_ctas)
    issue_us = warp_instrs / (active_sms * V100_ISSUE_PER_SM_CLK) / clock_per_us
    pipe_us: dict[str, float] = {}
    for kind, n in kinds.items():
        pipe = PIPE_OF_KIND.get(kind)
        rate = PIPE_RATE.get(pipe) if pipe else None
        if pipe and rate:
            per_pipe = n * launch.grid_ctas * math.ceil(threads / 32)
            pipe_us[pipe] = pipe_us.get(pipe, 0.0) + per_pipe / (active_sms * rate) / clock_per_us
    hmma_ops = kinds.get("hmma", 0) * launch.grid_ctas * math.ceil(threads / 32)
    if hmma_ops:
        # sm_70 issues one m8n8k4 f32 mma as 4 HMMA.884 steps; 1024 FMA per mma.
        pipe_us["hmma"] = hmma_ops / 4 * 1024 / HMMA_FMA_PER_CLK_SM / active_sms / clock_per_us
    memory_us = launch.bytes_per_call / (V100_READ_GB_S * 1e3)
    # Bandwidth reachable with the bytes in flight: Little's law over the whole GPU.
    total_in_flight = in_flight_sm * min(V100_SMS, launch.grid_ctas)
    latency_bw = total_in_flight / (latency_us * 1e3) if latency_us else float("inf")  # GB/s
    latency_bound_us = launch.bytes_per_call / (min(latency_bw, V100_READ_GB_S) * 1e3)
    # Wave model: CTAs run in waves of (resident CTAs per SM x SMs). A wave lasts at least its
    # bytes at the read ceiling, and at least one DRAM latency plus its SMs' issue time (loads
    # go out first, the dequantize-and-dot work follows); then the last warp finishes its own
    # instructions alone (one per clock).
    per_wave = max(1, blocks_per_sm) * V100_SMS
    waves = math.ceil(launch.grid_ctas / per_wave)
    warps_per_cta = math.ceil(threads / 32)
    wave_us = 0.0
    for w in range(waves):
        ctas = min(per_wave, launch.grid_ctas - w * per_wave)
        sms = min(V100_SMS, ctas)
        wave_mem = launch.bytes_per_call * ctas / launch.grid_ctas / (V100_READ_GB_S * 1e3)
        wave_issue = len(instrs) * warps_per_cta * math.ceil(ctas / sms) / V100_ISSUE_PER_SM_CLK
        wave_us += max(wave_mem, latency_us + wave_issue / clock_per_us)
    wave_us += len(instrs) / clock_per_us
    candidates = {
        "memory": memory_us,
        "bytes in flight": latency_bound_us,
        "issue": issue_us,
        f"waves ({waves})": wave_us,
        **{f"pipe {p}": t for p, t in pipe_us.items()},
    }
    limiter = max(candidates, key=lambda k: candidates[k])
    return KernelProjection(
        label=launch.label,
        mangled=mangled,
        registers=report.registers,
        smem_bytes=report.smem_bytes,
        spill_bytes=report.spill_store_bytes + report.spill_load_bytes,
        threads_per_block=threads,
        grid_ctas=launch.grid_ctas,
        blocks_per_sm_limit=blocks_limit,
        occupancy_warps=warps_resident,
        sass_total=len(instrs),
        kinds=kinds,
        per_32_weights=per32,
        loads_in_flight=n_loads,
        bytes_in_flight_per_thread=bytes_thread,
        bytes_in_flight_per_sm=in_flight_sm,
        bytes_in_flight_needed_per_sm=needed_sm,
        issue_us=issue_us,
        pipe_us=pipe_us,
        memory_us=memory_us,
        latency_bound_us=latency_bound_us,
        projected_us=candidates[limiter],
        limiter=limiter,
    )


def maxntid(ptx: str, mangled: str) -> int:
    m = re.search(
        re.escape(mangled) + r"\([^)]*\)\s*\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)", ptx, re.S
    )
    if not m:
        raise SystemExit(f"no .maxntid for {mangled}: the kernel lost its __launch_bounds__")
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3))


def run(fmt: str, latency_us: float, clock_mhz: float, workdir: Path) -> Projection:
    cuobjdump = find_cuobjdump()
    op_ptx, op_lowered, nvrtc_version = sm70_gate.compile_ptx("70")
    floor_launches = [floor_launch(fmt, n) for n in (4, 8, 16)]
    floor_ptx, floor_lowered = nvrtc_ptx(
        ROOT / "csrc" / "bench_floor.cu", [f.name_expr for f in floor_launches], []
    )
    ptxas_version = subprocess.run(
        [str(sm70_gate._nvidia_dir("cuda_nvcc") / "bin" / "ptxas"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    cuobj_version = subprocess.run(
        [str(cuobjdump), "--version"], capture_output=True, text=True, check=False
    ).stdout
    proj = Projection(
        fmt=fmt,
        nvrtc=nvrtc_version,
        ptxas=(re.findall(r"release ([\d.]+)", ptxas_version) or ["?"])[0],
        cuobjdump=(re.findall(r"release ([\d.]+)", cuobj_version) or ["?"])[0],
        latency_us=latency_us,
        clock_mhz=clock_mhz,
    )
    for ptx, lowered, launches, stem in (
        (op_ptx, op_lowered, OP_LAUNCHES[fmt], "op"),
        (floor_ptx, floor_lowered, floor_launches, "floor"),
    ):
        missing = [lz.name_expr for lz in launches if lz.name_expr not in lowered]
        if missing:
            raise SystemExit(
                f"the sm_70 build has no {', '.join(missing)}: update OP_LAUNCHES in this script "
                "to the kernels and grids the launcher (csrc/awq_moe_m1_cuda.cu) uses on sm_70"
            )
        cubin, log = ptxas(ptx, workdir, stem)
        reports = {
            lowered[lz.name_expr]: sm70_gate.KernelReport(lz.label, lowered[lz.name_expr], True)
            for lz in launches
        }
        sm70_gate.parse_ptxas(log, reports)
        sass = sass_by_function(cubin, cuobjdump)
        for lz in launches:
            mangled = lowered[lz.name_expr]
            proj.kernels.append(
                project_kernel(
                    lz,
                    mangled,
                    reports[mangled],
                    maxntid(ptx, mangled),
                    sass[mangled],
                    latency_us,
                    clock_mhz,
                )
            )
    proj.notes = [
        "PROJECTION, not a measurement: no V100 was used.",
        f"Little's law: {V100_READ_GB_S:.0f} GB/s x {latency_us} us loaded DRAM latency "
        f"[assumed] = {V100_READ_GB_S * latency_us / 1e3:.2f} MB in flight over {V100_SMS} SMs.",
        f"Issue and pipe times at {clock_mhz:.0f} MHz [assumed boost clock], static SASS counts "
        "(upper bounds: divergent epilogues counted for every warp).",
        "PROJ us is the largest of: bytes at the read ceiling, bytes in flight over the latency, "
        "issue, each pipe, and the wave model (per wave: max(bytes at the ceiling, latency + "
        "issue of the wave's resident warps), plus one warp's instructions at the end).",
        "Launch and graph-node overheads are not in the kernel times; add them from measurements.",
    ]
    return proj


def render(p: Projection) -> str:
    lines = [
        f"sm_70 build: NVRTC {p.nvrtc}, ptxas {p.ptxas}, cuobjdump {p.cuobjdump}; format {p.fmt}",
        f"{'kernel':16} {'regs':>4} {'smem':>6} {'spill':>5} {'thr':>4} {'CTAs':>5} "
        f"{'CTA/SM':>6} {'ld fly':>6} {'B/SM fly':>9} {'need':>6} {'mem us':>6} "
        f"{'fly us':>6} {'iss us':>6} {'PROJ us':>7} limiter",
    ]
    for k in p.kernels:
        lines.append(
            f"{k.label:16} {k.registers:>4} {k.smem_bytes:>6} {k.spill_bytes:>5} "
            f"{k.threads_per_block:>4} {k.grid_ctas:>5} {k.blocks_per_sm_limit:>6} "
            f"{k.loads_in_flight:>6} {k.bytes_in_flight_per_sm:>9.0f} "
            f"{k.bytes_in_flight_needed_per_sm:>6.0f} {k.memory_us:>6.2f} "
            f"{k.latency_bound_us:>6.2f} {k.issue_us:>6.2f} {k.projected_us:>7.2f} {k.limiter}"
        )
    lines.append(
        "pipe times (us, all SMs busy): "
        + "; ".join(
            f"{k.label}: " + ", ".join(f"{p} {t:.2f}" for p, t in sorted(k.pipe_us.items()))
            for k in p.kernels
            if not k.label.startswith("read_floor")
        )
    )
    lines.append("SASS per 32 weights (static count / (weights per thread / 32)):")
    for k in p.kernels:
        if k.per_32_weights:
            body = ", ".join(
                f"{kind} {v:.1f}"
                for kind, v in sorted(k.per_32_weights.items(), key=lambda kv: -kv[1])
            )
            lines.append(f"  {k.label}: {body}")
    op = [k for k in p.kernels if not k.label.startswith("read_floor")]
    op_us = sum(k.projected_us for k in op)
    ideal_us = sum(k.memory_us for k in op)
    lines.append(
        f"PROJECTION: op kernels {op_us:.2f} us per layer on a V100 before launch overheads "
        f"(ideal {ideal_us:.2f} us: the {p.fmt} bytes at {V100_READ_GB_S:.0f} GB/s)"
    )
    lines.extend(f"note: {n}" for n in p.notes)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("4byte", "3byte"), default="4byte")
    parser.add_argument(
        "--latency-us", type=float, default=0.6, help="loaded DRAM latency of a V100 [assumption]"
    )
    parser.add_argument(
        "--clock-mhz", type=float, default=1380.0, help="V100-PCIe boost clock [assumption]"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep PTX, cubins and SASS in this folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        proj = run(args.format, args.latency_us, args.clock_mhz, workdir)
    print(json.dumps(asdict(proj), indent=2) if args.json else render(proj))
    return 0


if __name__ == "__main__":
    sys.exit(main())
