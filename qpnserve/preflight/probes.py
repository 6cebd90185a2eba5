"""The machine probes: NVML, torch, nvcc, the installed host, the environment.

Each returns facts and never raises for a missing piece: no driver, no torch, no nvcc are
facts the checks turn into FAIL rows. None of them imports torch or vllm: importing torch
alone takes ~2.5 s on a 2-core machine, over the whole budget of `qpnserve check`, so torch is
read from its installed files: version and CUDA from torch/version.py; the arch list from the
flags string compiled into libtorch_python.so (what torch.cuda.get_arch_list() splits), else
from the CUDA fatbin headers of libtorch_cuda.so.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import mmap
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from qpnserve.dispatch.manifest import verify_installed
from qpnserve.errors import QpnError
from qpnserve.host import HostInfo, detect_host
from qpnserve.preflight.facts import GpuDevice, GpuFacts, NvccFacts, TorchFacts
from qpnserve.preflight.fatbin import fatbin_archs

NVCC_TIMEOUT_S = 20.0
# Variables that decide whether the host can take the route (contract sections 1 and 5), plus
# the ones that change which GPUs and toolkit are used.
# VLLM_1CAT_*: the host's automatic-speculation switches (qpnserve.speculation).
_ENV_PREFIXES = ("VLLM_SM70_AWQ_", "VLLM_SM70_MOE_", "VLLM_1CAT_")
_ENV_NAMES = ("VLLM_PLUGINS", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH")


def probe_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = environ
    return {k: v for k, v in sorted(env.items()) if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


def _nvml_text(value: object) -> str:
    # Older nvidia-ml-py returned bytes, newer returns str.
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpu(environ: Mapping[str, str]) -> GpuFacts:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import pynvml
    except ImportError as exc:
        return GpuFacts(nvml_ok=False, error=f"nvidia-ml-py is not importable ({exc})")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and OSError subclasses, by driver state
        return GpuFacts(
            nvml_ok=False, error=f"NVML did not initialise: {exc}", cuda_visible_devices=visible
        )
    try:
        driver = _nvml_text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12080
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    name=_nvml_text(pynvml.nvmlDeviceGetName(handle)),
                    compute_capability=f"{major}.{minor}",
                    memory_total_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                    uuid=_nvml_text(pynvml.nvmlDeviceGetUUID(handle)),
                )
            )
    except Exception as exc:  # a GPU that fell off the bus mid-query is a fact too
        return GpuFacts(
            nvml_ok=False, error=f"NVML query failed: {exc}", cuda_visible_devices=visible
        )
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return GpuFacts(
        nvml_ok=True,
        driver_version=driver,
        cuda_driver_version=f"{cuda_int // 1000}.{cuda_int % 1000 // 10}",
        devices=devices,
        cuda_visible_devices=visible,
    )


def _assigned_string(path: Path, name: str) -> tuple[bool, str | None]:
    """(found, value) of a module-level ``name = "..."`` / ``name: T = "..."`` (value None if
    assigned None)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False, None
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Constant):
            return True, value.value if isinstance(value.value, str) else None
    return False, None


# torch.cuda.get_arch_list() is torch._C._cuda_getArchFlags().split(): a compile-time constant
# stored as one NUL-terminated string in libtorch_python.so ("sm_75 sm_80 ... sm_120" in a
# 2.11.0+cu130 wheel, checked against get_arch_list() on an H200 host).
_ARCH_FLAGS = re.compile(rb"(?:sm|compute)_\d{2,3}[a-z]?(?: (?:sm|compute)_\d{2,3}[a-z]?)+\x00")
_MAX_SM_HITS = 100_000  # "sm_" occurrences to try before giving up (a 32 MB library has few)


def arch_flags_string(library: Path) -> list[str] | None:
    """torch's arch list read from its compiled-in flags string, or None when the library is
    absent or holds no single such string."""
    try:
        with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found: set[bytes] = set()
            pos = m.find(b"sm_")
            tries = 0
            while pos >= 0 and tries < _MAX_SM_HITS:
                tries += 1
                if pos > 0 and m[pos - 1] == 0:  # the start of a C string
                    match = _ARCH_FLAGS.match(m, pos)
                    if match:
                        found.add(match.group()[:-1])
                pos = m.find(b"sm_", pos + 3)
    except (OSError, ValueError):
        return None
    if len(found) != 1:
        return None
    return found.pop().decode().split()


def probe_torch(search_path: list[str] | None = None) -> TorchFacts:
    """torch's version, CUDA version and compiled GPU architectures, without importing it."""
    if search_path is None:
        spec = importlib.util.find_spec("torch")
    else:
        spec = importlib.machinery.PathFinder.find_spec("torch", search_path)
    if spec is None or not spec.submodule_search_locations:
        return TorchFacts(installed=False, error="torch is not importable in this Python")
    torch_dir = Path(next(iter(spec.submodule_search_locations)))
    found, version = _assigned_string(torch_dir / "version.py", "__version__")
    if not found:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            version = None
    found_cuda, cuda = _assigned_string(torch_dir / "version.py", "cuda")
    if not found_cuda:
        return TorchFacts(
            installed=True, version=version, error="torch/version.py does not state its CUDA"
        )
    if cuda is None:
        return TorchFacts(installed=True, version=version, cuda_version=None, arch_list=[])
    flags_lib = torch_dir / "lib" / "libtorch_python.so"
    flags = arch_flags_string(flags_lib)
    if flags is not None:
        return TorchFacts(
            installed=True,
            version=version,
            cuda_version=cuda,
            arch_list=flags,
            arch_source=f"archflags:{flags_lib.name}",
        )
    # Fallback: the architectures of the kernels themselves. A superset of the arch list
    # (bundled kernels may add newer architectures, e.g. sm_89), same verdict on sm_70.
    lib = torch_dir / "lib" / "libtorch_cuda.so"
    try:
        archs = fatbin_archs(lib)
    except OSError as exc:
        return TorchFacts(
            installed=True,
            version=version,
            cuda_version=cuda,
            error=f"cannot read the kernels of {lib.name}: {exc}",
        )
    return TorchFacts(
        installed=True,
        version=version,
        cuda_version=cuda,
        arch_list=archs,
        arch_source=f"fatbin:{lib.name}" if archs is not None else None,
        error=None if archs is not None else f"{lib.name} has no readable CUDA fatbin",
    )


def nvcc_candidates(environ: Mapping[str, str]) -> list[Path]:
    """Where a build finds nvcc, in torch.utils.cpp_extension's order: $CUDA_HOME, $CUDA_PATH,
    PATH, /usr/local/cuda."""
    env = environ
    out: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            out.append(Path(env[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        out.append(Path(on_path))
    out.append(Path("/usr/local/cuda/bin/nvcc"))
    return out


def parse_nvcc_version(text: str) -> str | None:
    """ "12.8" from `nvcc --version` output ("Cuda compilation tools, release 12.8, V12.8.93")."""
    match = re.search(r"release (\d+)\.(\d+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def probe_nvcc(environ: Mapping[str, str]) -> NvccFacts:
    for candidate in nvcc_candidates(environ):
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        try:
            out = subprocess.run(
                [str(candidate), "--version"],
                capture_output=True,
                text=True,
                timeout=NVCC_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return NvccFacts(found=True, path=str(candidate), error=f"nvcc --version: {exc}")
        version = parse_nvcc_version(out.stdout + out.stderr)
        error = None if version else "could not read a release number from nvcc --version"
        return NvccFacts(found=True, path=str(candidate), version=version, error=error)
    return NvccFacts(
        found=False, error="no nvcc in $CUDA_HOME, $CUDA_PATH, PATH or /usr/local/cuda"
    )


def _patch_status(
    package_dir: Path, version: str, dist_name: str | None
) -> tuple[str | None, str | None]:
    """(validated build, None) when the dispatch patch's drift check accepts the installed
    host source, else (None, why): the plugin's own check, run from files before any launch."""
    try:
        build = verify_installed(package_dir, version, dist_name=dist_name)
    except QpnError as exc:
        return None, exc.message
    return f"{build.distribution} {build.version}", None


def probe_host(search_path: list[str] | None = None) -> HostInfo:
    """The installed host with the patch verdict of a patchable one (found=False: none)."""
    host = detect_host(search_path)
    if host is None:
        return HostInfo(found=False)
    if host.kind != "patched":
        return host
    version = host.version or "unknown"
    validated, error = _patch_status(host.installed_dir, version, host.dist_name)
    return host.model_copy(update={"patch_validated": validated, "patch_error": error})
