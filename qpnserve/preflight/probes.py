"""The machine probes: NVML, torch, nvcc, the installed host, the environment.

Each returns facts and never raises for a missing piece: no driver, no torch, no nvcc are
facts the checks turn into FAIL rows. None of them imports torch or vllm: importing torch
alone takes ~2.5 s on a 2-core machine, over the whole budget of `qpnserve check`, so torch is
read from its installed files (metadata, torch/version.py, the CUDA fatbin of libtorch_cuda).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from qpnserve.preflight.facts import GpuDevice, GpuFacts, HostFacts, NvccFacts, TorchFacts
from qpnserve.preflight.fatbin import fatbin_archs

NVCC_TIMEOUT_S = 20.0
# Variables that decide whether the host can take the route (contract sections 1 and 5), plus
# the ones that change which GPUs and toolkit are used.
_ENV_PREFIXES = ("VLLM_SM70_AWQ_", "VLLM_SM70_MOE_")
_ENV_NAMES = ("VLLM_PLUGINS", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH")


def probe_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


def _nvml_text(value: object) -> str:
    # Older nvidia-ml-py returned bytes, newer returns str.
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpu() -> GpuFacts:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
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


def nvcc_candidates(environ: dict[str, str] | None = None) -> list[Path]:
    """Where a build finds nvcc, in torch.utils.cpp_extension's order: $CUDA_HOME, $CUDA_PATH,
    PATH, /usr/local/cuda."""
    env = dict(os.environ) if environ is None else environ
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


def probe_nvcc() -> NvccFacts:
    for candidate in nvcc_candidates():
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


def probe_host() -> HostFacts:
    from qpnserve.host import detect_host

    host = detect_host()
    if host is None:
        return HostFacts(found=False)
    return HostFacts(
        found=True,
        dist_name=host.dist_name,
        version=host.version,
        kind=host.kind,
        package_dir=str(host.package_dir),
        has_route_flag=host.has_route_flag,
        has_native_op=host.has_native_op,
        has_hook_method=host.has_hook_method,
    )
