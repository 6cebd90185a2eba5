"""Pure decisions over the per-rank route reports: is the route proven on, the one-line
summary `status` shows ("48/48 layers admitted on 4/4 ranks"), and whether the route fires on
single-token steps, from the graphs captured with it ("route captured in the 1-token graph on
48/48 layers on 4/4 ranks"; qpnserve.dispatch.graphs says why captures decide it).

The plugin's presence proves nothing (vLLM logs a plugin import error and carries on); only a
report from every rank, admitting every MoE layer, proves the route serves decode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, computed_field

from qpnserve.route_report import LayerDecision, RouteReport

GraphState = Literal[
    "route_in_1_token_graph",  # every layer of every rank: the route fires on 1-token steps
    "partial",  # some layers or ranks lack it
    "no_1_token_graph",  # graphs captured, none at one row: 1-token steps replay a padded one
    "eager",  # vLLM captures no graphs: the route is decided call by call
    "unknown",  # not observable (native host, nothing captured or recorded, no reports)
]


class RankSummary(BaseModel):
    rank: int
    route_flag: str
    admitted: int
    total: int
    patch_id: str | None
    build_key: str | None
    first_rejection: str | None  # "<layer>: <reason>" of the first non-admitted layer


class RouteSummary(BaseModel):
    tp: int
    expected_layers: int | None  # from the checkpoint's config.json, when it tells
    ranks: list[RankSummary]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        if not self.ranks:
            return f"no route reports (0/{self.tp} ranks)"
        admitted = min(r.admitted for r in self.ranks)
        totals = {r.total for r in self.ranks}
        total = self.expected_layers or max(totals)
        all_layers = all(r.admitted == total and r.total == total for r in self.ranks)
        ranks_ok = sum(1 for r in self.ranks if r.admitted == total and r.total == total)
        head = f"{admitted}/{total} layers admitted on {ranks_ok}/{self.tp} ranks"
        if all_layers and len(self.ranks) == self.tp:
            return head
        bad = [r for r in self.ranks if r.first_rejection]
        return head + (f" (rank {bad[0].rank}: {bad[0].first_rejection})" if bad else "")


def summarize(reports: list[RouteReport], tp: int, expected_layers: int | None) -> RouteSummary:
    ranks = []
    for report in reports:
        rejected = next((d for d in report.layers if not d.admitted), None)
        ranks.append(
            RankSummary(
                rank=report.tp_rank,
                route_flag=report.route_flag,
                admitted=report.num_admitted,
                total=len(report.layers),
                patch_id=report.patch_id,
                build_key=report.build_key,
                first_rejection=f"{rejected.layer}: {rejected.reason}" if rejected else None,
            )
        )
    return RouteSummary(tp=tp, expected_layers=expected_layers, ranks=ranks)


def route_problems(
    reports: list[RouteReport], *, tp: int, expected_layers: int | None, server_pids: set[int]
) -> list[str]:
    """Why the route is not proven on, one line each; empty when every rank admits every layer,
    reports at least ``expected_layers`` of them (when known) and all ranks report as many.

    ``server_pids``: pids of the server's process group, to refuse a report some other
    process wrote (the report dir is cleared before each start, this is belt and braces).
    """
    problems: list[str] = []
    by_rank = {r.tp_rank: r for r in reports}
    for rank in range(tp):
        report = by_rank.get(rank)
        if report is None:
            problems.append(
                f"rank {rank} wrote no route report: the plugin did not run in that worker "
                "(is qpnserve installed in the server's Python, and its plugin allowed?)"
            )
            continue
        if server_pids and report.pid not in server_pids:
            problems.append(f"rank {rank}: report written by pid {report.pid}, not by the server")
        if report.route_flag != "1":
            problems.append(f"rank {rank}: the plugin saw the route flag {report.route_flag!r}")
        if report.tp_size != tp:
            problems.append(f"rank {rank}: reports TP size {report.tp_size}, expected {tp}")
        for decision in report.layers:
            if not decision.admitted:
                problems.append(
                    f"rank {rank}: layer {decision.layer} not admitted: {decision.reason}"
                )
        if not report.layers:
            problems.append(f"rank {rank}: reports no MoE layer at all")
        elif expected_layers is not None and len(report.layers) < expected_layers:
            # More is fine (an MTP draft layer on the same MoE method reports too, and every
            # reported layer must still be admitted above); fewer means a layer went unseen.
            problems.append(
                f"rank {rank}: reports {len(report.layers)} MoE layers, the checkpoint has "
                f"{expected_layers} quantized MoE layers"
            )
    for rank in sorted(set(by_rank) - set(range(tp))):
        problems.append(f"a report names rank {rank}, outside TP size {tp}")
    # Every rank loads the same model, so each sees the same MoE layers. Checked apart from the
    # checkpoint's count, which is None when config.json does not tell (and allows extra layers).
    counts = {rank: len(by_rank[rank].layers) for rank in sorted(by_rank) if rank in range(tp)}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"rank {rank}: {n}" for rank, n in counts.items())
        problems.append(f"the ranks disagree on the MoE layer count: {listed}")
    return problems


def expected_moe_layers(model: Path) -> int | None:
    """MoE layers the route must cover (config.json, `text_config` or top level); None if unknown.

    The same layer rules as the preflight (qpnserve.preflight.layout): sparse layers by
    `mlp_only_layers` and `decoder_sparse_step`, minus the layers whose experts
    `modules_to_not_convert` keeps unquantized (the host gives those another MoE method, so the
    plugin never sees them). No expert count means no MoE layers to expect.
    """
    from qpnserve.preflight import layout

    try:
        raw = json.loads((model / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    found = layout.read_layout(raw, ())  # no tensor names: the default layer prefix
    if not isinstance(found.text.get("num_hidden_layers"), int) or not found.text.get(
        "num_experts"
    ):
        return None
    return len(found.quantized_moe_layers)


class RankGraphs(BaseModel):
    """What one rank's report says about the graphs captured with its MoE layers."""

    rank: int
    host_kind: str
    watched: bool  # False: the writer did not record captures
    planned_sizes: list[int] | None  # vLLM's capture sizes ([]: no graphs; None: unknown)
    layers: int
    captured_rows: list[int]  # every size captured on any of its layers
    layers_with_1_row_graph: int
    layers_with_route_in_1_row_graph: int
    first_gap: str | None  # "<layer>: <why>" of the first layer without the route at one row


class GraphSummary(BaseModel):
    tp: int
    ranks: list[RankGraphs]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def state(self) -> GraphState:
        return self._judge()[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fires_on_single_token(self) -> bool | None:
        """True: every layer of every rank captured the route in its 1-token graph; False: some
        or all single-token steps replay a graph without it; None: cannot be told."""
        return {"route_in_1_token_graph": True, "partial": False, "no_1_token_graph": False}.get(
            self._judge()[0]
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        return self._judge()[1]

    def _judge(self) -> tuple[GraphState, str]:
        if not self.ranks:
            return "unknown", f"unknown: no route reports (0/{self.tp} ranks)"
        blind = [r for r in self.ranks if not r.watched]
        if blind:
            return "unknown", (
                f"unknown: rank {blind[0].rank}'s report does not record graph captures (an "
                "older qpnserve, or a host method without apply() to watch)"
            )
        rows = sorted({n for r in self.ranks for n in r.captured_rows})
        if not rows:
            if all(r.planned_sizes == [] for r in self.ranks):
                return "eager", (
                    "unknown: eager mode, no CUDA graphs: the route is decided on each "
                    "single-token call, not recorded"
                )
            planned = self.ranks[0].planned_sizes
            why = (
                f"vLLM plans {_sizes(planned)}: still starting?"
                if planned
                else "eager mode, or graphs captured without running the layer's Python"
            )
            return "unknown", f"unknown: no CUDA graph capture observed ({why})"
        total = max(r.layers for r in self.ranks)
        if rows[0] != 1:
            return "no_1_token_graph", (
                f"no 1-token graph captured (smallest: {rows[0]} rows, on {len(self.ranks)}/"
                f"{self.tp} ranks): single-token steps replay a padded graph, the route cannot "
                "fire"
            )
        if any(r.host_kind == "native" for r in self.ranks):
            least = min(r.layers_with_1_row_graph for r in self.ranks)
            return "unknown", (
                f"unknown (native host): 1-token graph captured on {least}/{total} layers on "
                f"{len(self.ranks)}/{self.tp} ranks; whether the host's route is in it cannot "
                "be observed"
            )
        least = min(r.layers_with_route_in_1_row_graph for r in self.ranks)
        ok = [r for r in self.ranks if r.layers_with_route_in_1_row_graph == total == r.layers]
        head = f"route captured in the 1-token graph on {least}/{total} layers on {len(ok)}/"
        head += f"{self.tp} ranks"
        if len(ok) == self.tp == len(self.ranks):
            return "route_in_1_token_graph", head
        gaps = [f"rank {r.rank}: {r.first_gap}" for r in self.ranks if r.first_gap]
        gaps += [
            f"rank {n}: no report" for n in range(self.tp) if n not in {r.rank for r in self.ranks}
        ]
        return "partial", head + (f" ({gaps[0]})" if gaps else "")


def _sizes(sizes: list[int]) -> str:
    shown = ", ".join(str(n) for n in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
    return f"{len(sizes)} sizes ({shown} rows)"


def _one_row_graph(decision: LayerDecision) -> tuple[bool, bool | None]:
    """(a 1-row graph was captured with this layer, the route went into it)."""
    found = [g.route for g in decision.captured if g.rows == 1]
    return (True, found[0]) if found else (False, None)


def _gap(decision: LayerDecision) -> str:
    captured, route = _one_row_graph(decision)
    if not captured:
        return f"{decision.layer}: no 1-token graph captured"
    return f"{decision.layer}: " + (
        "captured at 1 row without the route" if route is False else "route not observable"
    )


def describe_captures(decision: LayerDecision) -> str:
    """One layer's capture record in words: "route in the 1-token graph; not in the 2-, 4-token
    graphs"."""
    if not decision.captured:
        return "no graph captured"
    parts = []
    for route, words in ((True, "route in"), (False, "not in"), (None, "unknown in")):
        rows = [g.rows for g in decision.captured if g.route is route]
        if rows:
            sizes = ", ".join([f"{n}-" for n in rows[:-1]] + [f"{rows[-1]}-token"])
            parts.append(f"{words} the {sizes} graph" + ("s" if len(rows) > 1 else ""))
    return "; ".join(parts)


def graph_summary(reports: list[RouteReport], tp: int) -> GraphSummary:
    ranks = []
    for report in reports:
        one_row = [_one_row_graph(d) for d in report.layers]
        gap = next((d for d in report.layers if _one_row_graph(d)[1] is not True), None)
        ranks.append(
            RankGraphs(
                rank=report.tp_rank,
                host_kind=report.host_kind,
                watched=report.graphs_watched,
                planned_sizes=report.planned_capture_sizes,
                layers=len(report.layers),
                captured_rows=sorted({g.rows for d in report.layers for g in d.captured}),
                layers_with_1_row_graph=sum(1 for captured, _ in one_row if captured),
                layers_with_route_in_1_row_graph=sum(1 for _, route in one_row if route is True),
                first_gap=_gap(gap) if gap else None,
            )
        )
    return GraphSummary(tp=tp, ranks=ranks)
