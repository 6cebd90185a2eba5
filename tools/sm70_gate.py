"""The sm_70 compile gate: the operator's device code built for V100 without a GPU or nvcc.

CUDA 13 cannot target sm_70, and CI has no GPU, so the gate compiles csrc/awq_moe_m1_kernels.cuh
(with the headers it includes) with the CUDA 12.8 NVRTC from PyPI
(nvidia-cuda-nvrtc-cu12; headers from nvidia-cuda-runtime-cu12) to PTX for compute_70, then
assembles it with ptxas 12.8 (nvidia-cuda-nvcc-cu12) for sm_70 and reads its resource report.
It fails on a compile error, on any spill or stack frame in a kernel that runs on sm_70, or
when the weight loads are not 128-bit. A test tool (also tests/kernels/test_sm70_gate.py), not
shipped in the wheel; in a source checkout: ``python -m tools.sm70_gate [--json]`` (prints the
report; --json for data). Exit 0 when every kernel that runs on sm_70 is spill-free with 128-bit
loads, 1 otherwise.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qpnserve.errors import BuildError
from qpnserve.resources import resource_dir

HEADER = "awq_moe_m1_kernels.cuh"
# (readable name, name expression, runs on sm_70?): the V100 design, the one CUDA form.
KERNELS: tuple[tuple[str, str, bool], ...] = (
    ("v100 design 4-byte m8n8k4", "qpn::v100_moe_kernel<false>", True),
    ("v100 design 3-byte m8n8k4", "qpn::v100_moe_kernel<true>", True),
)


@dataclass
class KernelReport:
    name: str
    mangled: str
    runs_on_sm70: bool
    registers: int = -1
    smem_bytes: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def clean(self) -> bool:
        return self.registers > 0 and self.spill_store_bytes == 0 and self.spill_load_bytes == 0


@dataclass
class GateReport:
    arch: str
    nvrtc_version: str
    ptxas_version: str
    kernels: list[KernelReport] = field(default_factory=list)
    ptx_loads_v4: int = 0  # ld.global.cs.v4 (128-bit streaming loads) in the PTX
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def _nvidia_dir(package: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(f"nvidia.{package}")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(
            f"the PyPI package for nvidia.{package} is not installed",
            hint="pip install -e '.[test]' (nvidia-cuda-nvrtc-cu12, -runtime-cu12, -nvcc-cu12)",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise BuildError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(status).decode()}")


def nvrtc_compile(
    source: bytes,
    filename: str,
    name_exprs: Sequence[str],
    arch: str = "70",
    defines: Sequence[str] = (),
    include_dir: Path | None = None,
) -> tuple[str, dict[str, str]]:
    """CUDA 12.8 NVRTC (from PyPI): device source -> (PTX for compute_<arch>, name expression ->
    mangled name). Include path: csrc/ (or include_dir) and the CUDA runtime headers. Shared by
    the gate and the sm_70 projection, so both read the same build."""
    lib = ctypes.CDLL(str(_nvidia_dir("cuda_nvrtc") / "lib" / "libnvrtc.so.12"))
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source, filename.encode(), 0, None, None),
        "create",
    )
    try:
        for expr in name_exprs:
            _check(lib, lib.nvrtcAddNameExpression(prog, expr.encode()), f"name {expr}")
        options = [
            f"--gpu-architecture=compute_{arch}".encode(),
            b"-std=c++17",
            b"-lineinfo",
            f"-I{include_dir or resource_dir('csrc')}".encode(),
            f"-I{_nvidia_dir('cuda_runtime') / 'include'}".encode(),
            *(f"-D{d}".encode() for d in defines),
        ]
        opts = (ctypes.c_char_p * len(options))(*options)
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        log_size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
        log = ctypes.create_string_buffer(log_size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if status != 0:
            raise BuildError(
                f"NVRTC could not compile {filename} for compute_{arch}:\n"
                + log.value.decode(errors="replace")
            )
        ptx_size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size)), "PTX size")
        ptx = ctypes.create_string_buffer(ptx_size.value)
        _check(lib, lib.nvrtcGetPTX(prog, ptx), "PTX")
        lowered: dict[str, str] = {}
        for expr in name_exprs:
            name = ctypes.c_char_p()
            _check(
                lib,
                lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(name)),
                f"lowered name {expr}",
            )
            lowered[expr] = (name.value or b"").decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode(), lowered


def nvrtc_version() -> str:
    lib = ctypes.CDLL(str(_nvidia_dir("cuda_nvrtc") / "lib" / "libnvrtc.so.12"))
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
    return f"{major.value}.{minor.value}"


def compile_ptx(arch: str = "70") -> tuple[str, dict[str, str], str]:
    """NVRTC: the header's kernels -> (PTX, name expression -> mangled name, NVRTC version)."""
    source = f'#include "{HEADER}"\n'.encode()
    exprs = [expr for _, expr, _ in KERNELS]
    ptx, lowered = nvrtc_compile(source, "sm70_gate.cu", exprs, arch)
    return ptx, lowered, nvrtc_version()


_FUNC = re.compile(r"(?:Compiling entry function|Function properties for) '?([\w$]+)'?")


def parse_ptxas(text: str, reports: dict[str, KernelReport]) -> None:
    """Fill registers/smem/stack/spills from ``ptxas -v`` output (per entry function)."""
    current: KernelReport | None = None
    for line in text.splitlines():
        match = _FUNC.search(line)
        if match:
            current = reports.get(match.group(1))
            continue
        if current is None:
            continue
        if m := re.search(
            r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line
        ):
            current.stack_bytes, current.spill_store_bytes, current.spill_load_bytes = map(
                int, m.groups()
            )
        if m := re.search(r"Used (\d+) registers", line):
            current.registers = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            current.smem_bytes = int(smem.group(1)) if smem else 0


def run_gate(arch: str = "70") -> GateReport:
    ptx, lowered, nvrtc_version = compile_ptx(arch)
    ptxas = _nvidia_dir("cuda_nvcc") / "bin" / "ptxas"
    version = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, check=False)
    ptxas_version = (re.findall(r"release ([\d.]+)", version.stdout) or ["?"])[0]
    report = GateReport(arch=f"sm_{arch}", nvrtc_version=nvrtc_version, ptxas_version=ptxas_version)
    by_mangled = {
        lowered[expr]: KernelReport(name=name, mangled=lowered[expr], runs_on_sm70=runs)
        for name, expr, runs in KERNELS
    }
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path = Path(tmp) / "gate.ptx"
        ptx_path.write_text(ptx)
        done = subprocess.run(
            [
                str(ptxas),
                f"-arch=sm_{arch}",
                "-v",
                "-O3",
                "-o",
                str(Path(tmp) / "gate.cubin"),
                str(ptx_path),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise BuildError(f"ptxas could not assemble the sm_{arch} PTX:\n{done.stderr}")
    parse_ptxas(done.stdout + done.stderr, by_mangled)
    report.kernels = list(by_mangled.values())
    report.ptx_loads_v4 = len(re.findall(r"ld\.global\.cs\.v4\.u32", ptx))
    for k in report.kernels:
        if k.registers < 0:
            report.problems.append(f"{k.name}: no ptxas resource report")
        elif k.runs_on_sm70 and not k.clean:
            report.problems.append(
                f"{k.name}: {k.spill_store_bytes} B spill stores, "
                f"{k.spill_load_bytes} B spill loads"
            )
        elif k.runs_on_sm70 and k.stack_bytes:
            report.problems.append(f"{k.name}: {k.stack_bytes} B stack frame (local memory)")
    if report.ptx_loads_v4 == 0:
        report.problems.append("no 128-bit streaming loads (ld.global.cs.v4.u32) in the PTX")
    return report


def render(report: GateReport) -> str:
    lines = [
        f"sm_70 gate: NVRTC {report.nvrtc_version}, ptxas {report.ptxas_version}, "
        f"target {report.arch}; {report.ptx_loads_v4} ld.global.cs.v4 in PTX",
        f"{'kernel':30} {'on sm_70':>8} {'regs':>5} {'smem B':>7} {'stack B':>8} "
        f"{'spill st/ld B':>14}",
    ]
    for k in report.kernels:
        lines.append(
            f"{k.name:30} {'yes' if k.runs_on_sm70 else 'no':>8} {k.registers:>5} "
            f"{k.smem_bytes:>7} {k.stack_bytes:>8} {k.spill_store_bytes:>6}/{k.spill_load_bytes:<7}"
        )
    lines.append("PASS" if report.ok else "FAIL: " + "; ".join(report.problems))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import json

    args = sys.argv[1:] if argv is None else argv
    try:
        report = run_gate()
    except BuildError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if "--json" in args:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
