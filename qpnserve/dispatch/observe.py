"""The plugin on a native host (ReVolta): watch the host's own route, never stand in its way.

The route there is the host's (and on by default), so nothing qpnserve does may stop a server
that would run without it: importing the host's module, finding its class, wrapping it, reading
a layer's decision or writing the rank report can each fail, and each failure becomes one
warning line in the server log. The patch manifest is not read at all here (it describes the
patched host's hook, and a broken copy must not take a native server down). What is lost is only
the proof: `qpnserve up` sees the missing rank reports and says so.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from qpnserve.dispatch.capture import Capture
from qpnserve.dispatch.recorder import RouteRecorder, tp_rank_and_size
from qpnserve.dispatch.wrap import Operator, install_observer
from qpnserve.host import (
    METHOD_CLASS,
    METHOD_MODULE,
    METHOD_MODULE_RELPATH,
    NATIVE_OP_NAME,
    HostInfo,
)
from qpnserve.route_report import report_path

logger = logging.getLogger("vllm.qpnserve_awq_m1")


class ObservingRecorder(RouteRecorder):
    """A RouteRecorder whose failures are warnings: the layer's own init has already run and
    succeeded, and an unwritable report must not turn that into a dead worker."""

    warned = False

    def record(self, layer: Any, admitted: bool, reason: str = "") -> Path:
        try:
            return super().record(layer, admitted, reason)
        except Exception as exc:
            if not self.warned:  # one line per process, not one per layer
                self.warned = True
                _warn("cannot write the route report", exc)
            rank = self.tp_rank if self.tp_rank is not None else tp_rank_and_size(layer)[0]
            return report_path(self.report_dir, rank)


def _warn(what: str, exc: BaseException) -> None:
    logger.warning(
        "qpnserve AWQ M1: %s on this native host (%s: %s); the host's own route is untouched "
        "and this process leaves no route report",
        what,
        type(exc).__name__,
        exc,
    )


def native_host_class(package_dir: Path) -> type:
    """The host's SM70 AWQ MoE class, from the very file the host was detected in."""
    module = importlib.import_module(METHOD_MODULE)
    loaded = Path(getattr(module, "__file__", "") or "").resolve()
    expected = (package_dir / METHOD_MODULE_RELPATH).resolve()
    if loaded != expected:
        raise ImportError(f"{METHOD_MODULE} was imported from {loaded}, not from {expected}")
    cls = getattr(module, METHOD_CLASS, None)
    if not isinstance(cls, type):
        raise ImportError(f"{METHOD_MODULE} defines no class {METHOD_CLASS}")
    return cls


def host_op() -> Operator:
    """The native host's own M1 op, ``_C::awq_moe_qpn_m1_sm70_out`` (resolved when first
    needed: vLLM loads the host's ``_C`` library after the plugins register)."""
    import torch

    return getattr(torch.ops._C, NATIVE_OP_NAME)


def observe_native(
    host: HostInfo, report_dir: Path, capture: Capture | None = None
) -> tuple[str, bool]:
    """Install the observer: ("observe", newly installed), or ("none", False) after one
    warning line when anything on the way fails. ``capture``: live `verify`'s, else None."""
    try:
        cls = native_host_class(host.installed_dir)
        recorder = ObservingRecorder(
            route_flag="1",
            host_kind="native",
            host_version=host.version or "unknown",
            patch_id=None,
            build_key=None,
            report_dir=report_dir,
        )
        newly = install_observer(cls, recorder=recorder, capture=capture, native_op=host_op)
        return "observe", newly
    except Exception as exc:  # whatever the host's import raises: the server goes on
        _warn("cannot observe the route", exc)
        return "none", False
