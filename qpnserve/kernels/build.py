"""Compile (``build``) or load (``load``) the operator extension from csrc/.

Two libraries come from csrc/: the operator (target "op": what ``qpnserve build`` compiles and a
server loads) and the bench extension (target "bench": csrc/bench_*.cu, the read floor, the
traced copy of the operator and the barrier probe), which only ``bench op`` builds and loads, so
the server's library carries no benchmark code. A build goes into ``<build dir>/<build_key>/``
(``Settings.build_dir``, passed by the caller) and is keyed by the target, its csrc sources, the
torch version, the CUDA version and the arch list, so a changed source or a different torch
never loads a stale library. ``load`` only ever loads a prebuilt operator (a server must never
compile); ``build`` is what ``qpnserve build`` runs.

torch is imported inside the functions: ``import qpnserve.kernels.build`` stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from qpnserve import config
from qpnserve.errors import BuildError
from qpnserve.kernels import toolchain
from qpnserve.resources import resource_dir

SOURCE_SUFFIXES = (".cu", ".cpp", ".h", ".cuh")
MANIFEST_NAME = "manifest.json"
BENCH_PREFIX = "bench_"  # csrc/bench_*: the bench extension's own files
TARGETS = ("op", "bench")
LIBRARY_PREFIXES = {"op": "qpnserve_ops", "bench": "qpnserve_bench"}
LIBRARY_PREFIX = LIBRARY_PREFIXES["op"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    path: Path  # the shared library (.so)
    build_key: str
    reused: bool  # True when an existing build was loaded or kept instead of compiling
    arch_list: tuple[str, ...]  # e.g. ("7.0",); empty for a CPU-only build
    with_cuda: bool
    torch_version: str
    cuda_version: str | None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["path"] = str(self.path)
        data["arch_list"] = list(self.arch_list)
        return data


def _no_progress(_: str) -> None:
    pass


def source_files(target: str = "op") -> list[Path]:
    """The csrc/ files a target's build reads (sorted; .cu, .cpp, .h, .cuh): the operator's
    are every file but csrc/bench_*; the bench extension reads those and the operator's
    headers (it includes them)."""
    root = resource_dir("csrc")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in SOURCE_SUFFIXES)
    if target == "op":
        return [p for p in files if not p.name.startswith(BENCH_PREFIX)]
    if target == "bench":
        return [p for p in files if p.name.startswith(BENCH_PREFIX) or p.suffix in (".h", ".cuh")]
    raise ValueError(f"unknown build target {target!r}")


def compiled_sources(target: str, cpu_only: bool) -> list[Path]:
    """The translation units of a target's build: the operator's .cpp (and .cu with CUDA), or
    the bench extension's bench_*.cu."""
    if target == "bench":
        return [p for p in source_files("bench") if p.suffix == ".cu"]
    suffixes = (".cpp",) if cpu_only else (".cpp", ".cu")
    return [p for p in source_files("op") if p.suffix in suffixes]


def sources_digest(target: str = "op") -> str:
    digest = hashlib.sha256()
    for path in source_files(target):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _torch_versions() -> tuple[str, str | None]:
    torch = toolchain.require_torch()

    return str(torch.__version__), torch.version.cuda


def build_key(arch_list: Sequence[str] | str | None, with_cuda: bool, target: str = "op") -> str:
    """Hash of the target, its csrc sources, the torch version, the CUDA version and the arch
    list."""
    torch_version, cuda_version = _torch_versions()
    archs = toolchain.normalize_arch_list(arch_list) if with_cuda else ()
    fields: dict[str, object] = {} if target == "op" else {"target": target}
    payload = json.dumps(
        {
            **fields,
            "sources": sources_digest(target),
            "torch": torch_version,
            "cuda": cuda_version if with_cuda else None,
            "archs": list(archs),
            "with_cuda": with_cuda,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _read_manifest(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _result_from_manifest(directory: Path, data: dict[str, object], reused: bool) -> BuildResult:
    archs = data.get("arch_list") or []
    return BuildResult(
        path=directory / str(data["library"]),
        build_key=str(data["build_key"]),
        reused=reused,
        arch_list=tuple(str(a) for a in archs) if isinstance(archs, list) else (),
        with_cuda=bool(data["with_cuda"]),
        torch_version=str(data["torch_version"]),
        cuda_version=None if data.get("cuda_version") is None else str(data["cuda_version"]),
    )


def _find_prebuilt(build_dir: Path, key: str) -> BuildResult | None:
    directory = build_dir / key
    data = _read_manifest(directory)
    if data is None or data.get("build_key") != key:
        return None
    result = _result_from_manifest(directory, data, reused=True)
    return result if result.path.is_file() else None


def _heartbeat(progress: Progress, label: str, stop: threading.Event) -> None:
    start = time.monotonic()
    while not stop.wait(15.0):
        progress(f"{label}: still compiling ({time.monotonic() - start:.0f} s)")


def build(
    arch_list: Sequence[str] | str | None = None,
    force: bool = False,
    cpu_only: bool = False,
    progress: Progress = _no_progress,
    target: str = "op",
    *,
    build_dir: Path,
) -> BuildResult:
    """Compile the extension (or reuse the cached build with the same key) and return it.

    arch_list: compute capabilities to compile for (e.g. "7.0"); None = the visible GPUs'.
    cpu_only: compile the C++ CPU implementation only (no CUDA needed; used by CI tests).
    target: "op" (the operator) or "bench" (the bench extension; CUDA only).
    Never called inside a running server: the plugin uses ``load``.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown build target {target!r}")
    if target == "bench" and cpu_only:
        raise BuildError("the bench extension needs CUDA", hint="build it on the GPU host")
    if "vllm" in sys.modules:
        raise BuildError(
            "refusing to compile the operator inside a process that has imported vLLM",
            hint="run `qpnserve build` before starting the server",
        )
    # Options first (a bad --arch is a usage error whatever is installed), then torch.
    archs: tuple[str, ...] = () if cpu_only else toolchain.normalize_arch_list(arch_list)
    torch = toolchain.require_torch(
        hint=toolchain.CPU_TORCH_HINT if cpu_only else toolchain.HOST_TORCH_HINT
    )
    from torch.utils import cpp_extension

    torch_version, torch_cuda = str(torch.__version__), torch.version.cuda
    if not cpu_only:
        if torch_cuda is None:
            # The real cause before any --arch advice: no arch list helps a CPU torch.
            refusal = toolchain.toolkit_refusal(archs, None, None)
            assert refusal is not None
            raise refusal
        archs = archs or toolchain.local_arch_list()
        if not archs:
            raise BuildError(
                "no CUDA GPU is visible to pick the arch list from",
                hint=f"pass --arch 7.0 (V100) to `qpnserve build`, or set "
                f"{config.BUILD_ARCH.name}=7.0 (read by `build` and by `up`)",
            )
        refusal = toolchain.toolkit_refusal(
            archs, toolchain.nvcc_version(cpp_extension.CUDA_HOME), torch_cuda
        )
        if refusal is not None:
            raise refusal
        for arch in archs:
            if toolchain.torch_has_arch(arch) is False:
                raise BuildError(
                    f"torch {torch_version} carries no sm_{arch.replace('.', '')} kernels, "
                    "so it cannot run on that GPU",
                    hint="use the host's torch build (1Cat-vLLM: torch 2.10.0+cu128 has sm_70)",
                )

    key = build_key(archs, with_cuda=not cpu_only, target=target)
    what = "the operator" if target == "op" else "the bench extension"
    if not force:
        cached = _find_prebuilt(build_dir, key)
        if cached is not None:
            progress(f"reusing the build of {what} in {cached.path.parent}")
            return _ensure_loaded(cached, target)
    current = loaded(target)
    if current is not None:
        raise BuildError(
            f"a build of {what} ({current.path}) is already loaded in this process",
            hint="run `qpnserve build` in a fresh process",
        )

    from filelock import FileLock

    directory = build_dir / key
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory.parent / f"{key}.lock")):
        if not force:  # another process may have finished it while we waited
            cached = _find_prebuilt(build_dir, key)
            if cached is not None:
                return _ensure_loaded(cached, target)
        (directory / MANIFEST_NAME).unlink(missing_ok=True)
        sources = [str(p) for p in compiled_sources(target, cpu_only)]
        name = f"{LIBRARY_PREFIXES[target]}_{key}"
        label = f"{'CPU' if cpu_only else 'sm_' + ','.join(a.replace('.', '') for a in archs)}"
        progress(f"compiling {what}: {len(sources)} sources for {label} into {directory}")
        stop = threading.Event()
        ticker = threading.Thread(target=_heartbeat, args=(progress, label, stop), daemon=True)
        started = time.monotonic()
        ticker.start()
        # torch's builder reads its arch list from this process's environment only.
        arch_env = None if cpu_only else ";".join(archs)
        try:
            with config.process_environ_set("TORCH_CUDA_ARCH_LIST", arch_env):
                library = cpp_extension.load(
                    name=name,
                    sources=sources,
                    extra_cflags=["-O3", "-std=c++17"],
                    extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo"],
                    extra_include_paths=[str(resource_dir("csrc"))],
                    build_directory=str(directory),
                    with_cuda=not cpu_only,
                    is_python_module=False,
                    is_standalone=False,
                    verbose=False,
                )
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            last = str(exc).strip().splitlines()
            raise BuildError(
                f"compiling {what} failed: {last[-1] if last else exc}",
                hint=f"the full compiler output is in {directory}; rerun with --force",
            ) from exc
        finally:
            stop.set()
        del library  # cpp_extension.load already loaded it into torch.ops
        so_path = directory / f"{name}.so"
        if not so_path.is_file():
            raise BuildError(f"the compiler produced no {so_path.name} in {directory}")
        manifest = {
            "target": target,
            "build_key": key,
            "library": so_path.name,
            "arch_list": list(archs),
            "with_cuda": not cpu_only,
            "torch_version": torch_version,
            "cuda_version": torch_cuda if not cpu_only else None,
            "sources_digest": sources_digest(target),
            "compile_s": round(time.monotonic() - started, 1),
        }
        from qpnserve.fsutil import atomic_write_text

        atomic_write_text(directory / MANIFEST_NAME, json.dumps(manifest, indent=2), mode=0o644)
        progress(f"compiled in {manifest['compile_s']} s")
        result = _result_from_manifest(directory, manifest, reused=False)
        _register_loaded(result, target)
        return result


# The libraries loaded into this process, by target (one each at most: every operator build
# defines TORCH_LIBRARY(qpnserve), every bench build TORCH_LIBRARY(qpnserve_bench)).
_LOADED: dict[str, BuildResult] = {}
_LOAD_LOCK = threading.Lock()


def _register_loaded(result: BuildResult, target: str = "op") -> None:
    _LOADED[target] = result
    if target == "op":
        from qpnserve.kernels import ops

        ops.register_fake_once()


def loaded(target: str = "op") -> BuildResult | None:
    """The build of ``target`` loaded into this process, if any."""
    return _LOADED.get(target)


def _load_library(result: BuildResult, target: str = "op") -> BuildResult:
    """torch.ops.load_library of ``result``, recorded as this process's build of ``target``.
    Caller holds _LOAD_LOCK."""
    import torch

    try:
        torch.ops.load_library(str(result.path))
    except (OSError, RuntimeError) as exc:
        raise BuildError(
            f"loading {result.path} failed: {exc}",
            hint="rebuild it with `qpnserve build --force`",
        ) from exc
    _register_loaded(result, target)
    return result


def _ensure_loaded(result: BuildResult, target: str = "op") -> BuildResult:
    """Load ``result`` unless a build of ``target`` is already loaded (one per process)."""
    with _LOAD_LOCK:
        if loaded(target) is None:
            _load_library(result, target)
    return result


def _matching_builds(build_dir: Path, archs: tuple[str, ...], cpu_only: bool) -> list[BuildResult]:
    torch_version, torch_cuda = _torch_versions()
    digest = sources_digest()
    root = build_dir
    found: list[tuple[float, BuildResult]] = []
    if not root.is_dir():
        return []
    for directory in root.iterdir():
        data = _read_manifest(directory)
        if data is None or data.get("sources_digest") != digest:
            continue
        if data.get("target", "op") != "op":
            continue
        if data.get("torch_version") != torch_version or bool(data.get("with_cuda")) == cpu_only:
            continue
        if not cpu_only and data.get("cuda_version") != torch_cuda:
            continue
        result = _result_from_manifest(directory, data, reused=True)
        if archs and tuple(result.arch_list) != archs:
            continue
        if result.path.is_file():
            found.append((result.path.stat().st_mtime, result))
    return [r for _, r in sorted(found, key=lambda item: item[0], reverse=True)]


def load(
    arch_list: Sequence[str] | str | None = None, cpu_only: bool = False, *, build_dir: Path
) -> BuildResult:
    """Load a prebuilt extension into ``torch.ops.qpnserve``; never compiles.

    Picks the newest build of the current sources for this torch (and CUDA) version, with the
    given arch list when one is given. Raises BuildError naming the command that builds it.
    Loading twice is a no-op. Does not initialise CUDA.
    """
    archs = () if cpu_only else toolchain.normalize_arch_list(arch_list)
    with _LOAD_LOCK:
        current = loaded()
        if current is not None:
            # A CUDA build also carries the CPU implementation, so it serves a CPU-only request.
            if cpu_only or (current.with_cuda and (not archs or current.arch_list == archs)):
                return current
            raise BuildError(
                f"another build of the operator ({current.path}) is already loaded in this process",
                hint="start a new process to load a different build",
            )
        candidates = _matching_builds(build_dir, archs, cpu_only)
        if not candidates:
            kind = "CPU-only" if cpu_only else "CUDA"
            wanted = f" for sm_{','.join(a.replace('.', '') for a in archs)}" if archs else ""
            command = "qpnserve build --cpu-only" if cpu_only else "qpnserve build"
            if archs:
                command += f" --arch {';'.join(archs)}"
            raise BuildError(
                f"no {kind} build of the operator{wanted} matches these sources and this torch "
                f"in {build_dir}",
                hint=f"run `{command}` first (outside the server)",
            )
        return _load_library(candidates[0])
