"""What the toolkit and torch can build for: pure decisions over versions and arch lists, and the
two small probes they need (nvcc's version, the visible GPUs' compute capabilities).

Split from build.py so the decisions read and test on their own; torch is imported lazily.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from qpnserve.errors import BuildError, UsageError

# CUDA 13 dropped the Volta (sm_70/sm_72) targets; sm_75 is the oldest it compiles.
_OLDEST_ARCH_BY_CUDA_MAJOR = {13: (7, 5)}


def normalize_arch_list(arch_list: Sequence[str] | str | None) -> tuple[str, ...]:
    """'7.0;9.0' / ['7.0', '9.0'] / '70' -> ('7.0', '9.0'); raises UsageError on junk."""
    if arch_list is None:
        return ()
    items = re.split(r"[;,\s]+", arch_list) if isinstance(arch_list, str) else list(arch_list)
    archs: set[str] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        match = re.fullmatch(r"(?:sm_)?(\d)\.?(\d)", item)
        if not match:
            raise UsageError(
                f"unknown CUDA arch {item!r}",
                hint="give compute capabilities like 7.0 (V100), 8.0 or 9.0",
            )
        archs.add(f"{match.group(1)}.{match.group(2)}")
    return tuple(sorted(archs, key=lambda a: tuple(int(p) for p in a.split("."))))


def nvcc_version(cuda_home: str | None) -> tuple[int, int] | None:
    """(major, minor) of CUDA_HOME's nvcc, or None when there is none."""
    if not cuda_home:
        return None
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    if not nvcc.exists():
        return None
    try:
        text = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def toolkit_refusal(
    archs: Sequence[str], toolkit: tuple[int, int] | None, torch_cuda: str | None
) -> BuildError | None:
    """Pure decision: why this toolkit / torch pair cannot build ``archs`` (None when it can)."""
    if torch_cuda is None:
        return BuildError(
            "this torch has no CUDA support, so the CUDA operator cannot be built",
            hint="install the host's CUDA build of torch (1Cat-vLLM ships torch 2.10.0+cu128)",
        )
    if toolkit is None:
        return BuildError(
            "no CUDA toolkit (nvcc) was found",
            hint="install a CUDA 12.x toolkit and set CUDA_HOME to it",
        )
    oldest = _OLDEST_ARCH_BY_CUDA_MAJOR.get(toolkit[0])
    if toolkit[0] > max(_OLDEST_ARCH_BY_CUDA_MAJOR):
        oldest = _OLDEST_ARCH_BY_CUDA_MAJOR[max(_OLDEST_ARCH_BY_CUDA_MAJOR)]
    if oldest is not None:
        too_old = [a for a in archs if tuple(int(p) for p in a.split(".")) < oldest]
        if too_old:
            return BuildError(
                f"CUDA {toolkit[0]}.{toolkit[1]} cannot compile for sm_"
                f"{too_old[0].replace('.', '')} (Volta support ended with CUDA 12)",
                hint="build with a CUDA 12.x toolkit (CUDA_HOME) and a cu12x torch, "
                "as 1Cat-vLLM uses (CUDA 12.8, torch 2.10.0+cu128)",
            )
    return None


# Where a torch comes from, by what it is needed for: the CUDA operator builds against the
# host's torch; the CPU-only build (CI, a laptop) needs any torch, which the test extra brings.
HOST_TORCH_HINT = "run qpnserve with the host's Python (ReVolta and 1Cat-vLLM bring torch 2.10.0)"
CPU_TORCH_HINT = (
    "install the test extra's CPU torch (pip install -e '.[test]' in a checkout), or run "
    "qpnserve with the host's Python"
)


def require_torch(
    purpose: str = "the operator cannot be built", hint: str = HOST_TORCH_HINT
) -> ModuleType:
    """The installed torch, or a BuildError: the operator builds against the host's torch,
    and `qpnserve check` runs where that torch may not be installed yet."""
    try:
        import torch
    except ImportError:
        raise BuildError(
            f"torch is not installed in this Python, so {purpose}", hint=hint
        ) from None
    return torch


def torch_has_arch(arch: str) -> bool | None:
    """Whether the installed torch carries kernels for ``arch`` (None: cannot tell)."""
    import torch

    try:
        flags = str(torch._C._cuda_getArchFlags() or "")
    except (AttributeError, RuntimeError):
        return None
    if not flags:
        return None
    tag = arch.replace(".", "")
    return f"sm_{tag}" in flags or f"compute_{tag}" in flags


def local_arch_list() -> tuple[str, ...]:
    """The compute capabilities of the visible GPUs (initialises CUDA; CLI use only)."""
    import torch

    if torch.version.cuda is None or not torch.cuda.is_available():
        return ()
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return normalize_arch_list([f"{major}.{minor}" for major, minor in caps])
