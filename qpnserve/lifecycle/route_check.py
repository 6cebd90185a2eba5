"""Pure decisions over the per-rank route reports: is the route proven on, and the one-line
summary `status` shows ("48/48 layers admitted on 4/4 ranks").

The plugin's presence proves nothing (vLLM logs a plugin import error and carries on); only a
report from every rank, admitting every MoE layer, proves the route serves decode.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, computed_field

from qpnserve.route_report import RouteReport


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
    text = layout.text_config(raw)
    if not isinstance(text.get("num_hidden_layers"), int) or not text.get("num_experts"):
        return None
    quant = layout.quant_config(raw) or {}
    not_convert = [m for m in quant.get("modules_to_not_convert") or [] if isinstance(m, str)]
    return sum(
        1
        for i in layout.moe_layer_indices(text)
        if not layout.layer_excluded(layout.DEFAULT_LAYER_PREFIX, i, not_convert)
    )
