"""The binding and host code compile against torch 2.10.0's headers (the users' torch).

Users build the extension against torch 2.10.0+cu128; the test venv carries a newer CPU torch.
This fetches the torch 2.10.0 wheel (PyPI's manylinux x86_64 wheel, --no-deps, cached per user
by tools/sm70proj/wheels.py), unpacks only torch/include, and runs ``g++ -fsyntax-only`` on
every csrc/*.cpp and on a host translation unit made of the torch, c10 and CUDA runtime headers
that csrc/awq_moe_m1_cuda.cu includes plus its host-only headers (ATen/cuda/CUDAContext.h stands
in as c10/cuda/CUDAStream.h: the former also needs the CUDA math-library headers). The .cu
itself needs an nvcc 12.x driver, which no PyPI wheel ships (nvidia-cuda-nvcc-cu12 carries
ptxas and libnvvm only), so its kernel-launch body is compiled by the CUDA build tests on a GPU
machine instead.
Set QPNSERVE_NO_NETWORK=1 to skip it where the registry cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.sm70proj import wheels

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torch210_include() -> Path:
    if os.environ.get("QPNSERVE_NO_NETWORK") == "1":
        pytest.skip("QPNSERVE_NO_NETWORK=1: the torch 2.10.0 wheel cannot be fetched")
    if shutil.which("g++") is None:
        pytest.skip("no g++ on PATH")
    wheel = wheels.fetch(wheels.TORCH_210)
    assert "torch-2.10.0" in wheel.name
    return wheels.extract(wheel, "torch/include/") / "torch" / "include"


def _syntax_check(source: Path, include: Path, extra: list[str]) -> None:
    cmd = ["g++", "-std=c++17", "-fsyntax-only", f"-I{include}",
           f"-I{include / 'torch/csrc/api/include'}", f"-I{CSRC}", *extra, str(source)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{source.name} against torch 2.10.0:\n{done.stderr[-4000:]}"


# ATen/cuda/CUDAContext.h also pulls the cuBLAS/cuSPARSE/cuSOLVER headers (wheels of ~1 GB);
# the stream API the launcher takes from it is declared in c10/cuda/CUDAStream.h.
STAND_INS = {"ATen/cuda/CUDAContext.h": "c10/cuda/CUDAStream.h"}


def cu_host_unit(cu_text: str) -> str:
    """The host headers a .cu includes: torch/c10/ATen/CUDA-runtime ones and local .h files."""
    keep = []
    for line in cu_text.splitlines():
        m = re.match(r'\s*#include\s+([<"])([^>"]+)[>"]', line)
        if not m:
            continue
        name = m.group(2)
        if name in STAND_INS:
            keep.append(f"#include <{STAND_INS[name]}>")
        elif name.startswith(("ATen/", "c10/", "torch/", "cuda_runtime")) or (
            m.group(1) == '"' and name.endswith(".h")
        ):
            keep.append(line.strip())
    return "\n".join(keep) + "\n"


def test_cu_host_unit_keeps_torch_and_host_headers_only() -> None:
    text = '#include <ATen/cuda/CUDAContext.h>\n#include "a_kernels.cuh"\n#include "host_only.h"\n'
    assert cu_host_unit(text) == '#include <c10/cuda/CUDAStream.h>\n#include "host_only.h"\n'


@pytest.mark.parametrize("source", sorted(p.name for p in CSRC.glob("*.cpp")))
def test_cpp_binding_compiles_against_torch_2_10(torch210_include: Path, source: str) -> None:
    _syntax_check(CSRC / source, torch210_include, [])


def test_cu_host_headers_compile_against_torch_2_10(torch210_include: Path, tmp_path) -> None:
    # The CUDA 12.8 headers of the test dependencies: the runtime API, and crt/ from the nvcc wheel.
    from nvidia import cuda_nvcc, cuda_runtime

    includes = [Path(next(iter(m.__path__))) / "include" for m in (cuda_runtime, cuda_nvcc)]
    unit = tmp_path / "cu_host.cpp"
    unit.write_text(cu_host_unit((CSRC / "awq_moe_m1_cuda.cu").read_text()))
    assert "c10/cuda/CUDAGuard.h" in unit.read_text()
    _syntax_check(unit, torch210_include, [f"-I{d}" for d in includes])
