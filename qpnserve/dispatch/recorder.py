"""The per-rank route report, kept current while the host initialises its MoE layers.

Trigger: after each MoE layer's process_weights_after_loading (the point where the host has set
every attribute the init contract reads), the rank's report is rewritten atomically with all
layers seen so far. No later hook is needed, a reader never sees half a file, and a server that
dies on a layer that failed the contract still leaves a report naming that layer. A report that
lists fewer layers than the model has means the rank stopped while loading.

Graph capture: while vLLM captures its CUDA graphs (after every layer is initialised), the
wrappers report each layer's captured batch sizes and whether the route went into each graph
(record_capture). A server captures dozens of sizes for every layer, so these writes are
gathered: the report is rewritten at most once per ``CAPTURE_FLUSH_S`` (a timer thread, pure
file work, no CUDA call), and the last batch lands well before the server answers /health.
A failed capture write is a warning: the report then says less, never something false.

Rank: ``layer.moe_config.tp_rank`` (the MoE layer's own parallel config), else the
torch.distributed rank when a process group is initialised, else 0.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from qpnserve.config import RouteFlagValue, Settings
from qpnserve.host import HostKind
from qpnserve.route_report import CapturedGraph, LayerDecision, RouteReport, write_report

# A child of vLLM's "vllm" logger, so these lines carry vLLM's format and per-process prefix.
logger = logging.getLogger("vllm.qpnserve_awq_m1")

REPORTS_SUBDIR = "reports"  # the same folder qpnserve.state uses under the state dir
CAPTURE_FLUSH_S = 0.5  # gathers a capture pass's records into few writes; read per recorder


def rank_report_dir(settings: Settings) -> Path:
    """Where this rank writes: $QPNSERVE_REPORT_DIR (set by `qpnserve up`), else
    <state dir>/reports."""
    return settings.report_dir or settings.state_dir / REPORTS_SUBDIR


def layer_name(layer: Any) -> str:
    """The host's layer prefix (FusedMoE.layer_name), else a stable stand-in."""
    name = getattr(layer, "layer_name", None)
    return str(name) if name else f"<unnamed MoE layer {id(layer):#x}>"


def tp_rank_and_size(layer: Any) -> tuple[int, int]:
    moe_config = getattr(layer, "moe_config", None)
    rank, size = getattr(moe_config, "tp_rank", None), getattr(moe_config, "tp_size", None)
    if isinstance(rank, int) and isinstance(size, int):
        return rank, size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, size if isinstance(size, int) else 1


class RouteRecorder:
    """Collects one LayerDecision per MoE layer and rewrites this rank's report each time."""

    def __init__(
        self,
        *,
        route_flag: RouteFlagValue,
        host_kind: HostKind,
        host_version: str,
        patch_id: str | None,
        build_key: str | None,
        report_dir: Path,
    ) -> None:
        self.route_flag: RouteFlagValue = route_flag
        self.host_kind: HostKind = host_kind
        self.host_version = host_version
        self.patch_id = patch_id
        self.build_key = build_key
        self.report_dir = report_dir
        self.decisions: dict[str, LayerDecision] = {}
        self.tp_rank: int | None = None
        self.tp_size: int | None = None
        self.last_path: Path | None = None
        self.graphs_watched = False
        self.planned_capture_sizes: list[int] | None = None
        self.captures: dict[str, dict[int, bool | None]] = {}  # layer -> rows -> route
        self.capture_flush_s = CAPTURE_FLUSH_S
        self._lock = threading.RLock()  # the timer thread writes too
        self._timer: threading.Timer | None = None
        self._capture_write_failed = False

    def record(self, layer: Any, admitted: bool, reason: str = "") -> Path:
        """Record one layer's decision (a re-initialised layer replaces its entry) and write."""
        name = layer_name(layer)
        with self._lock:
            if self.tp_rank is None:
                self.tp_rank, self.tp_size = tp_rank_and_size(layer)
            self.decisions[name] = LayerDecision(layer=name, admitted=admitted, reason=reason)
            self.last_path = write_report(self.report_dir, self.report())
        if len(self.decisions) == 1:
            logger.info(
                "qpnserve AWQ M1 (%s host %s, patch %s, build %s): rank %d writes its route "
                "report to %s",
                self.host_kind,
                self.host_version,
                self.patch_id,
                self.build_key,
                self.tp_rank,
                self.last_path,
            )
        return self.last_path

    def watch_graphs(self, planned_capture_sizes: list[int] | None) -> None:
        """The wrappers watch graph capture in this process; vLLM plans these sizes (None:
        unknown, []: no graphs). Written with the next record."""
        with self._lock:
            self.graphs_watched = True
            self.planned_capture_sizes = planned_capture_sizes

    def record_capture(self, layer: Any, rows: int, route: bool | None) -> None:
        """One capture of ``layer`` at ``rows`` rows; ``route``: the route went into it (None:
        not observable). Several captures at one size (FULL and PIECEWISE graphs) agree only if
        all carried the route: one without it keeps False."""
        name = layer_name(layer)
        with self._lock:
            by_rows = self.captures.setdefault(name, {})
            if rows in by_rows:
                seen = by_rows[rows]
                route = None if seen is None or route is None else seen and route
            by_rows[rows] = route
            if self.capture_flush_s <= 0:
                self._write_captures()
            elif self._timer is None:
                self._timer = threading.Timer(self.capture_flush_s, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Write the capture records gathered so far now (the timer's job; tests call it)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._write_captures()

    def _write_captures(self) -> None:
        if not self.decisions:
            return  # nothing initialised here: no rank, no report to add to
        try:
            self.last_path = write_report(self.report_dir, self.report())
        except Exception as exc:  # the timer thread: nobody would see the exception
            if not self._capture_write_failed:
                self._capture_write_failed = True
                logger.warning(
                    "qpnserve AWQ M1: cannot write the graph-capture records to the route "
                    "report (%s: %s); the report lacks them",
                    type(exc).__name__,
                    exc,
                )

    def report(self) -> RouteReport:
        layers = [
            decision.model_copy(
                update={
                    "captured": [
                        CapturedGraph(rows=rows, route=route)
                        for rows, route in sorted(self.captures.get(decision.layer, {}).items())
                    ]
                }
            )
            for decision in self.decisions.values()
        ]
        return RouteReport(
            route_flag=self.route_flag,
            host_kind=self.host_kind,
            host_version=self.host_version,
            patch_id=self.patch_id,
            build_key=self.build_key,
            tp_rank=self.tp_rank if self.tp_rank is not None else 0,
            tp_size=self.tp_size if self.tp_size is not None else 1,
            pid=os.getpid(),
            layers=layers,
            graphs_watched=self.graphs_watched,
            planned_capture_sizes=self.planned_capture_sizes,
        )
