"""The per-rank route report, kept current while the host initialises its MoE layers.

Trigger: after each MoE layer's process_weights_after_loading (the point where the host has set
every attribute the init contract reads), the rank's report is rewritten atomically with all
layers seen so far. No later hook is needed, a reader never sees half a file, and a server that
dies on a layer that failed the contract still leaves a report naming that layer. A report that
lists fewer layers than the model has means the rank stopped while loading.

Rank: ``layer.moe_config.tp_rank`` (the MoE layer's own parallel config), else the
torch.distributed rank when a process group is initialised, else 0.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from qpnserve.config import REPORT_DIR, state_dir
from qpnserve.host import HostKind
from qpnserve.route_report import LayerDecision, RouteReport, write_report

# A child of vLLM's "vllm" logger, so these lines carry vLLM's format and per-process prefix.
logger = logging.getLogger("vllm.qpnserve_awq_m1")

REPORTS_SUBDIR = "reports"  # the same folder qpnserve.state uses under the state dir


def report_dir_from_env() -> Path:
    """$QPNSERVE_REPORT_DIR (set by `qpnserve up`), else <state dir>/reports."""
    override = os.environ.get(REPORT_DIR.name)
    if override:
        return Path(override).expanduser()
    return state_dir() / REPORTS_SUBDIR


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
        route_flag: Literal["0", "1"],
        host_kind: HostKind,
        host_version: str,
        patch_id: str | None,
        build_key: str | None,
        report_dir: Path,
    ) -> None:
        self.route_flag: Literal["0", "1"] = route_flag
        self.host_kind: HostKind = host_kind
        self.host_version = host_version
        self.patch_id = patch_id
        self.build_key = build_key
        self.report_dir = report_dir
        self.decisions: dict[str, LayerDecision] = {}
        self.tp_rank: int | None = None
        self.tp_size: int | None = None
        self.last_path: Path | None = None

    def record(self, layer: Any, admitted: bool, reason: str = "") -> Path:
        """Record one layer's decision (a re-initialised layer replaces its entry) and write."""
        name = layer_name(layer)
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

    def report(self) -> RouteReport:
        return RouteReport(
            route_flag=self.route_flag,
            host_kind=self.host_kind,
            host_version=self.host_version,
            patch_id=self.patch_id,
            build_key=self.build_key,
            tp_rank=self.tp_rank if self.tp_rank is not None else 0,
            tp_size=self.tp_size if self.tp_size is not None else 1,
            pid=os.getpid(),
            layers=list(self.decisions.values()),
        )
