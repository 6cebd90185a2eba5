"""The file format between the plugin (writer) and the lifecycle (reader): every path, name and
schema of the report directory lives here, and nothing else reads or writes those files.

- The per-rank route report, written by the plugin in every tensor-parallel worker once its MoE
  layers are initialised, read by `qpnserve up` (to verify admission) and `qpnserve status`.
  File: ``<report dir>/route-rank<R>.json`` (one per rank), written atomically.
- The refusal record, written by the plugin in a process that refuses the route, read by `up`.
  File: ``<report dir>/route-refusal-pid<P>.json``.

Report schema 2 adds what the plugin saw of CUDA graph capture (``graphs_watched``,
``planned_capture_sizes``, each layer's ``captured``); every added field has a default, so a
schema-1 report (an older plugin) still loads, and reads as "captures not recorded".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from qpnserve.config import RouteFlagValue
from qpnserve.errors import StateError
from qpnserve.fsutil import atomic_write_text
from qpnserve.host import HostKind

SCHEMA_VERSION = 2  # of RouteReport: 2 added the graph-capture fields
REFUSAL_SCHEMA_VERSION = 1
_REPORT_GLOB = "route-rank*.json"
_REFUSAL_GLOB = "route-refusal-pid*.json"


class CapturedGraph(BaseModel):
    """One CUDA graph captured with this layer in it. vLLM runs a layer's Python only in eager
    calls and while it captures a graph; a replay runs the captured kernels, so whether the
    route is in a graph is decided once, here, for every replay of it."""

    rows: int  # rows the layer saw during capture: the graph's (padded) batch size
    route: bool | None  # the AWQ M1 route was captured in it; None: not observable (native host)


class LayerDecision(BaseModel):
    """One MoE layer's init-contract outcome on one rank, and the graphs captured with it."""

    layer: str  # the host's layer prefix, e.g. "model.language_model.layers.7.mlp.experts"
    admitted: bool
    reason: str = ""  # empty when admitted; else the failed requirement
    captured: list[CapturedGraph] = Field(default_factory=list)  # by rows, ascending


class RouteReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    route_flag: RouteFlagValue
    host_kind: HostKind
    host_version: str
    patch_id: str | None  # None on a native host (nothing patched)
    build_key: str | None  # the loaded extension's build key; None on a native host
    tp_rank: int
    tp_size: int
    pid: int
    written_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    layers: list[LayerDecision]
    # False: the writer did not watch graph capture (schema 1, or a host class with no apply()).
    graphs_watched: bool = False
    # vLLM's own capture sizes in this process, read at load time: [] no graphs (eager);
    # None not readable. What was captured is in each layer's ``captured``.
    planned_capture_sizes: list[int] | None = None

    @property
    def num_admitted(self) -> int:
        return sum(1 for d in self.layers if d.admitted)


def report_path(report_dir: Path, tp_rank: int) -> Path:
    return report_dir / f"route-rank{tp_rank}.json"


def _write(path: Path, record: BaseModel) -> Path:
    atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
    return path


def write_report(report_dir: Path, report: RouteReport) -> Path:
    return _write(report_path(report_dir, report.tp_rank), report)


def read_reports(report_dir: Path) -> list[RouteReport]:
    """All rank reports in ``report_dir``, sorted by rank. A corrupt file is a StateError."""
    reports = []
    for path in sorted(report_dir.glob(_REPORT_GLOB)):
        try:
            reports.append(RouteReport.model_validate(json.loads(path.read_text("utf-8"))))
        except (OSError, ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            raise StateError(
                f"route report {path.name} is unreadable: {first}",
                hint=f"delete {path} and restart the server to rewrite it",
            ) from None
    return sorted(reports, key=lambda r: r.tp_rank)


class RouteRefusal(BaseModel):
    """Why the plugin refused the route in one vLLM process (flag "1"): the process stops, and
    with it the server, so `qpnserve up` reads this to say why in one line.

    File: ``<report dir>/route-refusal-pid<P>.json``. vLLM runs the plugin first in its API
    server (while parsing arguments), so a host that cannot carry the route refuses there,
    before any tensor-parallel worker exists: the process name says where it happened.
    """

    schema_version: int = REFUSAL_SCHEMA_VERSION
    route_flag: str  # as the process saw it (a refusal of a malformed flag records it)
    process: str  # multiprocessing's name of the process (vLLM names its workers)
    pid: int
    written_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    reason: str


def refusal_path(report_dir: Path, pid: int) -> Path:
    return report_dir / f"route-refusal-pid{pid}.json"


def write_refusal(report_dir: Path, refusal: RouteRefusal) -> Path:
    return _write(refusal_path(report_dir, refusal.pid), refusal)


def read_refusals(report_dir: Path) -> list[RouteRefusal]:
    """Every readable refusal, oldest first; an unreadable one is skipped (it only explains a
    failure that `up` reports anyway)."""
    refusals = []
    for path in report_dir.glob(_REFUSAL_GLOB):
        try:
            refusals.append(RouteRefusal.model_validate(json.loads(path.read_text("utf-8"))))
        except (OSError, ValueError, ValidationError):
            continue
    return sorted(refusals, key=lambda r: r.written_at)


def clear_reports(report_dir: Path) -> None:
    """Remove every report and refusal: one of an earlier server never speaks for the next."""
    for pattern in (_REPORT_GLOB, _REFUSAL_GLOB):
        for stale in report_dir.glob(pattern):
            stale.unlink(missing_ok=True)
