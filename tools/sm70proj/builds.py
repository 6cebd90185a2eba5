"""Machine code to project: ours (compiled here for sm_70) and the host's (read from its wheel).

Ours: the op's device code through the CI gate's NVRTC 12.8 (compute_70), then ptxas 12.8
(sm_70). The host's: ``vllm/_C.abi3.so`` of the registry's ReVolta wheel, whose sm_70 cubins
cuobjdump 12.8 (from the triton 3.3.1 wheel; CUDA 13 tools refuse sm_70) lists. Both wheels are
fetched by name and cached per user (wheels.py); nothing of the host is written into the tree.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools import sm70_gate

from . import sass, scoreboard, wheels
from .model import Kernel, SassStats

ROOT = Path(__file__).resolve().parents[2]
HOST_SO = "vllm/_C.abi3.so"


@dataclass
class Binary:
    """One kernel's machine code and resource use, whichever compiler made it."""

    mangled: str
    instrs: list[str]
    registers: int
    smem_bytes: int
    spill_bytes: int
    threads: int  # 0 when the binary does not say (the launcher does)
    controls: list[scoreboard.Control]  # index for index with instrs


def cuobjdump() -> Path:
    explicit = os.environ.get("QPNSERVE_CUOBJDUMP")
    if explicit:
        return Path(explicit)
    root = wheels.extract(wheels.fetch(wheels.TRITON), "triton/backends/nvidia/bin/")
    return root / "triton/backends/nvidia/bin/cuobjdump"


def tool_release(exe: Path) -> str:
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
    return (re.findall(r"release ([\d.]+)", out) or ["?"])[0]


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{Path(cmd[0]).name} failed: {(done.stderr or done.stdout)[-2000:]}")
    return done.stdout


def parse_res_usage(text: str) -> dict[str, tuple[int, int, int]]:
    """cuobjdump -res-usage -> mangled name: (registers, shared bytes, local (spill) bytes)."""
    out: dict[str, tuple[int, int, int]] = {}
    name = None
    for line in text.splitlines():
        if m := re.search(r"Function (\S+?):?$", line.strip()):
            name = m.group(1)
        elif name and (m := re.search(r"REG:(\d+).*SHARED:(\d+).*LOCAL:(\d+)", line)):
            out[name] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            name = None
    return out


def host_binaries(fragments: list[str], workdir: Path) -> dict[str, Binary]:
    """fragment -> the host kernel whose mangled name contains it (from the wheel's _C.abi3.so)."""
    root = wheels.extract(wheels.fetch(wheels.REVOLTA), HOST_SO)
    tool = cuobjdump()
    cubins = workdir / "host-cubins"
    cubins.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(tool), "-xelf", "all", str(root / HOST_SO)], cwd=cubins, capture_output=True
    )
    found: dict[str, Binary] = {}
    for cubin in sorted(cubins.glob("*.cubin")):
        if b"awq_qpn_m1_sm70" not in cubin.read_bytes():
            continue
        text = _run([str(tool), "-sass", str(cubin)])
        listing, controls = sass.parse_listing(text), scoreboard.parse_controls(text)
        usage = parse_res_usage(_run([str(tool), "-res-usage", str(cubin)]))
        for frag in fragments:
            for mangled, instrs in listing.items():
                if frag in mangled and mangled in usage:
                    regs, smem, local = usage[mangled]
                    found[frag] = Binary(mangled, instrs, regs, smem, local, 0, controls[mangled])
    missing = [f for f in fragments if f not in found]
    if missing:
        raise SystemExit(f"the ReVolta wheel's {HOST_SO} has no kernel matching {missing}")
    return found


def ptxas(ptx: str, workdir: Path, stem: str) -> tuple[Path, str]:
    exe = sm70_gate._nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    ptx_path, cubin = workdir / f"{stem}.ptx", workdir / f"{stem}.cubin"
    ptx_path.write_text(ptx)
    log = subprocess.run(
        [str(exe), "-arch=sm_70", "-O3", "-v", "-o", str(cubin), str(ptx_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if log.returncode != 0:
        raise SystemExit(f"ptxas failed:\n{log.stderr}")
    return cubin, log.stdout + log.stderr


def maxntid(ptx: str, mangled: str) -> int:
    m = re.search(
        re.escape(mangled) + r"\([^)]*\)\s*\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)", ptx, re.S
    )
    if not m:
        raise SystemExit(f"no .maxntid for {mangled}: the kernel lost its __launch_bounds__")
    return int(m.group(1)) * int(m.group(2)) * int(m.group(3))


def our_binaries(
    name_exprs: list[str], source: Path | None, workdir: Path, stem: str
) -> dict[str, Binary]:
    """name expression -> our kernel for sm_70 (source None: the op, as the gate builds it)."""
    if source is None:
        ptx, lowered, _ = sm70_gate.compile_ptx("70")
    else:
        ptx, lowered = sm70_gate.nvrtc_compile(
            source.read_bytes(), source.name, name_exprs, "70", []
        )
    missing = [e for e in name_exprs if e not in lowered]
    if missing:
        raise SystemExit(
            f"the sm_70 build has no {', '.join(missing)}: point OUR_KERNELS in "
            "tools/sm70proj/tables.py at the kernels the launcher uses on sm_70"
        )
    cubin, log = ptxas(ptx, workdir, stem)
    reports = {lowered[e]: sm70_gate.KernelReport(e, lowered[e], True) for e in name_exprs}
    sm70_gate.parse_ptxas(log, reports)
    text = _run([str(cuobjdump()), "-sass", str(cubin)])
    listing, controls = sass.parse_listing(text), scoreboard.parse_controls(text)
    out = {}
    for e in name_exprs:
        r = reports[lowered[e]]
        spill = r.spill_store_bytes + r.spill_load_bytes
        out[e] = Binary(
            lowered[e], listing[lowered[e]], r.registers, r.smem_bytes, spill,
            maxntid(ptx, lowered[e]), controls[lowered[e]],
        )  # fmt: skip
    return out


def real_bytes_per_cta(b: Binary, k: Kernel, loads: tuple[int, ...]) -> float:
    """The DRAM bytes a CTA really reads through ``loads`` (instruction indices): each DRAM
    tensor's bytes per CTA, shared out by the loads' widths over every listed load of it (loops
    scaled by how often they run). Lanes of m8n8k4 fragments load the same metadata, so widths
    x threads overstate the bytes (the V100 design's W2: 160 B x 320 threads, 32,000 B real)."""
    params = sass.param_of_each(b.instrs)
    dram = set(k.dram_params)
    per_thread = k.dram_bytes / (k.ctas * k.threads)
    repeats = max(1.0, per_thread / max(sass.listed_bytes(b.instrs, dram), 1))
    total = 0.0
    for p, nbytes in k.param_bytes:
        mine = sum(sass.load_width_bytes(sass.opcode(b.instrs[i])) for i in loads if params[i] == p)
        listed = sass.listed_bytes(b.instrs, {p}) * repeats
        total += nbytes / k.ctas * mine / listed if listed else 0.0
    return total


def stats(b: Binary, k: Kernel) -> SassStats:
    dram_params = set(k.dram_params)
    _, in_flight = sass.loads_in_flight(b.instrs, dram_params)
    params = sass.param_of_each(b.instrs)
    dram = [p in dram_params for p in params]
    end = scoreboard.tail(b.instrs, b.controls, dram)
    overlap = after = 0
    tail_bytes, handoff_in_overlap = 0.0, False
    if end is not None:
        overlap = end.wait_at - end.last_load - 1
        after = end.exit_at - end.wait_at + 1
        tail_bytes = real_bytes_per_cta(b, k, end.loads_waited)
        window = b.instrs[end.last_load + 1 : end.wait_at]
        handoff_in_overlap = any(sass.opcode(i).startswith("ATOM") for i in window)
    found = scoreboard.bubbles(b.instrs, b.controls, dram, params)
    return SassStats(
        registers=b.registers,
        smem_bytes=b.smem_bytes,
        instructions=len(b.instrs),
        dram_bytes_in_flight=in_flight,
        dram_bytes_listed=sass.listed_bytes(b.instrs, dram_params),
        prologue_l2_trips=sass.prologue_trips(b.instrs, dram_params),
        epilogue_instructions=after,
        epilogue_overlap_instructions=overlap,
        tail_bytes_per_cta=tail_bytes,
        handoff_in_overlap=handoff_in_overlap,
        bubble_instructions=sum(x.instructions for x in found),
        bubble_l2_trips=sum(x.l2_trips for x in found),
        bubbles=len(found),
    )
