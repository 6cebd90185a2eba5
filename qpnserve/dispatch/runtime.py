"""activate(): what the plugin does when the route flag is "1". The only side-effecting stage.

Order matters: the host is identified and its source checked against the manifest from the
installed files *before* any of its modules is imported; the prebuilt extension is loaded
(never compiled) before anything is wrapped; the wrapping itself is idempotent.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpnserve.config import ROUTE_FLAG, Settings
from qpnserve.dispatch.capture import capture_from_settings
from qpnserve.dispatch.manifest import (
    PatchManifest,
    Target,
    load_manifest,
    verify_installed,
)
from qpnserve.dispatch.recorder import RouteRecorder, rank_report_dir
from qpnserve.dispatch.wrap import Operator, applied_mode, install_patched
from qpnserve.errors import DispatchError

logger = logging.getLogger("vllm.qpnserve_awq_m1")


@dataclass(frozen=True)
class Activation:
    """What activate() did in this process."""

    host_kind: str  # "patched" or "native"
    host_version: str
    mode: str  # "patched" (wrapped), "observe" (native host, report only), "none"
    newly_applied: bool  # False when this process had already applied it (re-entrant call)
    build_key: str | None
    validated_as: str | None  # "<dist> <version>" of the matching validated build


def load_operator(build_dir: Path) -> tuple[Operator, str, tuple[str, ...]]:
    """Load the prebuilt extension (BuildError "... run `qpnserve build`" when missing or
    stale; never compiles) and return its op, build key and CUDA archs (() if CPU-only)."""
    from qpnserve.kernels.build import load

    result = load(build_dir=build_dir)
    import torch

    archs = tuple(result.arch_list) if result.with_cuda else ()
    return torch.ops.qpnserve.awq_moe_m1_out, str(result.build_key), archs


def import_host_class(target: Target, package_dir: Path) -> type:
    """Import the host class, refusing a module that is not the file that was fingerprinted
    (another vllm earlier on sys.path would otherwise be patched unchecked)."""
    module = importlib.import_module(target.module)
    expected = (package_dir / target.module_path).resolve()
    loaded = Path(getattr(module, "__file__", "") or "").resolve()
    if loaded != expected:
        raise DispatchError(
            f"{target.module} was imported from {loaded}, not from the checked host file "
            f"{expected}; refusing to patch it",
            hint="run the server from a directory outside any vllm source checkout",
        )
    cls = getattr(module, target.class_name, None)
    if not isinstance(cls, type):
        raise DispatchError(f"{target.module} defines no class {target.class_name}")
    return cls


def check_signatures(cls: type, target: Target) -> None:
    """Each wrapped method takes exactly the parameters the wrapper passes on."""
    for name, expected in target.signatures.items():
        params = list(inspect.signature(getattr(cls, name)).parameters)
        if params != expected:
            raise DispatchError(
                f"{target.class_name}.{name} takes ({', '.join(params)}), the patch expects "
                f"({', '.join(expected)}); refusing to patch a drifted host",
                hint=f"set {ROUTE_FLAG.name}=0, or use a validated host build",
            )


def activate(
    settings: Settings, manifest: PatchManifest | None = None, host: Any = None
) -> Activation:
    """Apply the patch (patched host, fail closed) or the observer (native host, which never
    raises: qpnserve.dispatch.observe) for route flag "1"."""
    if host is None:
        from qpnserve.host import detect_host

        host = detect_host()
    if host is None or host.kind == "none":
        found = "no vllm package" if host is None else host.label
        raise DispatchError(
            f"{ROUTE_FLAG.name}=1 but the installed host ({found}) has neither the native AWQ M1 "
            "route nor the AWQSM70MoEMethod._apply_legacy_single_token_compact hook",
            hint="pip install revolta==0.1.4 (native route) or install the 1Cat-vLLM v1.3.0 "
            "wheel (patched route), or unset the flag",
        )
    if host.kind == "native":
        from qpnserve.dispatch.observe import observe_native

        capture = capture_from_settings(settings)  # live `verify` only; None when serving
        mode, newly = observe_native(host, rank_report_dir(settings), capture)
        return Activation("native", host.version, mode, newly, None, None)

    manifest = manifest or load_manifest()
    target = manifest.target
    report_dir = rank_report_dir(settings)
    build = verify_installed(host.installed_dir, host.version, manifest, host.dist_name)
    cls = import_host_class(target, host.installed_dir)
    if applied_mode(cls) is not None:  # a second register() in this process: nothing to do
        return Activation("patched", host.version, "patched", False, None, None)
    check_signatures(cls, target)
    op, build_key, op_archs = load_operator(settings.build_dir)
    recorder = RouteRecorder(
        route_flag="1",
        host_kind="patched",
        host_version=host.version,
        patch_id=manifest.id,
        build_key=build_key,
        report_dir=report_dir,
    )
    install_patched(
        cls,
        op=op,
        recorder=recorder,
        patch_id=manifest.id,
        op_archs=op_archs,
        capture=capture_from_settings(settings),  # live `verify` only; None when serving
    )
    validated_as = f"{build.distribution} {build.version}"
    logger.info(
        "qpnserve AWQ M1 dispatch applied to %s.%s (%s, validated as %s; extension %s)",
        target.module,
        target.class_name,
        host.label,
        validated_as,
        build_key,
    )
    return Activation("patched", host.version, "patched", True, build_key, validated_as)
