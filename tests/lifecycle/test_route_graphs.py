"""The one line `status` shows on whether the route fires on single-token steps, decided over the
rank reports' graph-capture records (pure; reports built literally here)."""

from __future__ import annotations

from qpnserve.lifecycle.route_check import describe_captures, graph_summary
from qpnserve.route_report import CapturedGraph, LayerDecision, RouteReport


def layer(index: int, captured: dict[int, bool | None]) -> LayerDecision:
    return LayerDecision(
        layer=f"L{index}",
        admitted=True,
        captured=[CapturedGraph(rows=n, route=r) for n, r in sorted(captured.items())],
    )


def report(
    rank: int,
    captured: dict[int, bool | None] | None = None,
    *,
    layers: int = 48,
    host_kind: str = "patched",
    watched: bool = True,
    planned: list[int] | None = None,
    odd_layer: tuple[int, dict[int, bool | None]] | None = None,
) -> RouteReport:
    captured = {1: True, 2: False, 4: False} if captured is None else captured
    decisions = [layer(i, captured) for i in range(layers)]
    if odd_layer is not None:
        decisions[odd_layer[0]] = layer(odd_layer[0], odd_layer[1])
    return RouteReport(
        route_flag="1",
        host_kind=host_kind,  # type: ignore[arg-type]
        host_version="1.3.0",
        patch_id="p" if host_kind == "patched" else None,
        build_key="k" if host_kind == "patched" else None,
        tp_rank=rank,
        tp_size=4,
        pid=100,
        layers=decisions,
        graphs_watched=watched,
        planned_capture_sizes=planned,
    )


def test_route_in_every_1_token_graph_on_every_rank() -> None:
    summary = graph_summary([report(r) for r in range(4)], tp=4)
    assert summary.text == "route captured in the 1-token graph on 48/48 layers on 4/4 ranks"
    assert summary.state == "route_in_1_token_graph"
    assert summary.fires_on_single_token is True


def test_a_layer_captured_at_1_row_without_the_route_is_named() -> None:
    reports = [report(r) for r in range(4)]
    reports[2] = report(2, odd_layer=(7, {1: False, 2: False}))
    summary = graph_summary(reports, tp=4)
    assert summary.text == (
        "route captured in the 1-token graph on 47/48 layers on 3/4 ranks "
        "(rank 2: L7: captured at 1 row without the route)"
    )
    assert summary.state == "partial" and summary.fires_on_single_token is False


def test_a_missing_rank_is_named() -> None:
    summary = graph_summary([report(r) for r in range(3)], tp=4)
    assert summary.text == (
        "route captured in the 1-token graph on 48/48 layers on 3/4 ranks (rank 3: no report)"
    )
    assert summary.fires_on_single_token is False


def test_no_1_token_graph_captured_is_a_result() -> None:
    # Speculation with 4 draft tokens rounds vLLM's capture sizes up to multiples of 5.
    reports = [report(r, {5: False, 10: False}, planned=[5, 10]) for r in range(4)]
    summary = graph_summary(reports, tp=4)
    assert summary.text == (
        "no 1-token graph captured (smallest: 5 rows, on 4/4 ranks): single-token steps "
        "replay a padded graph, the route cannot fire"
    )
    assert summary.state == "no_1_token_graph" and summary.fires_on_single_token is False


def test_eager_mode_says_why_it_cannot_tell() -> None:
    summary = graph_summary([report(r, {}, planned=[]) for r in range(4)], tp=4)
    assert summary.text == (
        "unknown: eager mode, no CUDA graphs: the route is decided on each single-token call, "
        "not recorded"
    )
    assert summary.state == "eager" and summary.fires_on_single_token is None


def test_planned_graphs_not_yet_captured_are_unknown() -> None:
    summary = graph_summary([report(r, {}, planned=[1, 2, 4]) for r in range(4)], tp=4)
    assert summary.text == (
        "unknown: no CUDA graph capture observed (vLLM plans 3 sizes (1, 2, 4 rows): still "
        "starting?)"
    )
    assert summary.fires_on_single_token is None


def test_native_host_captures_say_unknown_for_the_route() -> None:
    reports = [report(r, {1: None, 2: None}, host_kind="native") for r in range(4)]
    summary = graph_summary(reports, tp=4)
    assert summary.text == (
        "unknown (native host): 1-token graph captured on 48/48 layers on 4/4 ranks; whether "
        "the host's route is in it cannot be observed"
    )
    assert summary.state == "unknown" and summary.fires_on_single_token is None


def test_native_host_without_a_1_token_graph_is_still_a_result() -> None:
    reports = [report(r, {2: None}, host_kind="native") for r in range(4)]
    assert graph_summary(reports, tp=4).fires_on_single_token is False


def test_a_report_from_an_older_plugin_is_unknown_not_absent() -> None:
    reports = [report(r) for r in range(4)]
    reports[1] = report(1, {}, watched=False)
    summary = graph_summary(reports, tp=4)
    assert summary.text == (
        "unknown: rank 1's report does not record graph captures (an older qpnserve, or a host "
        "method without apply() to watch)"
    )
    assert summary.fires_on_single_token is None


def test_no_reports_is_unknown() -> None:
    summary = graph_summary([], tp=4)
    assert summary.text == "unknown: no route reports (0/4 ranks)"
    assert summary.fires_on_single_token is None


def test_one_layer_record_in_words() -> None:
    assert describe_captures(layer(0, {1: True, 2: False, 4: False})) == (
        "route in the 1-token graph; not in the 2-, 4-token graphs"
    )
    assert describe_captures(layer(0, {})) == "no graph captured"
    assert describe_captures(layer(0, {1: None})) == "unknown in the 1-token graph"
