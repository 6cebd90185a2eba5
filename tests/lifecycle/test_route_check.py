"""Pure decisions over route reports, and the restart-needed decision."""

from __future__ import annotations

import json
from pathlib import Path

from qpnserve.lifecycle import restart_command, restart_decision
from qpnserve.lifecycle.route_check import expected_moe_layers, route_problems, summarize
from qpnserve.route_report import LayerDecision, RouteReport
from qpnserve.state import DesiredState, RunningState


def report(rank: int, layers: int = 48, refuse: int | None = None, pid: int = 100) -> RouteReport:
    return RouteReport(
        route_flag="1",
        host_kind="patched",
        host_version="1.3.0",
        patch_id="p",
        build_key="k",
        tp_rank=rank,
        tp_size=4,
        pid=pid,
        layers=[
            LayerDecision(layer=f"L{i}", admitted=i != refuse, reason="" if i != refuse else "why")
            for i in range(layers)
        ],
    )


def test_summary_of_four_healthy_ranks() -> None:
    summary = summarize([report(r) for r in range(4)], tp=4, expected_layers=48)
    assert summary.text == "48/48 layers admitted on 4/4 ranks"
    assert (
        route_problems([report(r) for r in range(4)], tp=4, expected_layers=48, server_pids=set())
        == []
    )


def test_missing_rank_and_refused_layer_are_named() -> None:
    reports = [report(0), report(1), report(3, refuse=7)]
    problems = route_problems(reports, tp=4, expected_layers=48, server_pids=set())
    assert problems[0].startswith("rank 2 wrote no route report")
    assert problems[1] == "rank 3: layer L7 not admitted: why"
    assert summarize(reports, 4, 48).text == "47/48 layers admitted on 2/4 ranks (rank 3: L7: why)"


def test_layer_count_short_of_the_checkpoint_is_a_problem() -> None:
    problems = route_problems(
        [report(r, layers=47) for r in range(4)], tp=4, expected_layers=48, server_pids=set()
    )
    assert "rank 0: reports 47 MoE layers, the checkpoint has 48 quantized MoE layers" in problems


def test_an_extra_admitted_layer_such_as_an_mtp_draft_is_not_a_problem() -> None:
    reports = [report(r, layers=49) for r in range(4)]
    assert route_problems(reports, tp=4, expected_layers=48, server_pids=set()) == []


def test_expected_layers_leave_out_experts_kept_unquantized(tmp_path: Path) -> None:
    config = {
        "text_config": {"num_hidden_layers": 4, "num_experts": 512},
        "quantization_config": {
            "modules_to_not_convert": ["model.language_model.layers.0.mlp.experts"]
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert expected_moe_layers(tmp_path) == 3


def test_expected_layers_read_a_bare_string_not_to_convert_as_the_preflight_does(
    tmp_path: Path,
) -> None:
    # A string is not a list of modules: the preflight ignores it (every MoE layer quantized);
    # iterated as characters it once matched every layer and expected none.
    config = {
        "text_config": {"num_hidden_layers": 4, "num_experts": 512},
        "quantization_config": {"modules_to_not_convert": "model.language_model.layers.0"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert expected_moe_layers(tmp_path) == 4


def test_report_from_a_process_outside_the_server_is_refused() -> None:
    problems = route_problems(
        [report(r, pid=1) for r in range(4)], tp=4, expected_layers=48, server_pids={100}
    )
    assert problems[0] == "rank 0: report written by pid 1, not by the server"


def test_expected_layers_follow_sparse_step_and_dense_layers(tmp_path: Path) -> None:
    config = {
        "text_config": {
            "num_hidden_layers": 8,
            "num_experts": 512,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [1],
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert expected_moe_layers(tmp_path) == 3  # layers 3, 5, 7
    (tmp_path / "config.json").write_text("{broken")
    assert expected_moe_layers(tmp_path) is None


def running(route_flag: str = "1", **kw: object) -> RunningState:
    base = dict(
        phase="ready",
        pid=1,
        pgid=1,
        proc_start_ticks=None,
        started_at="2026-01-01T00:00:00Z",
        argv=[],
        env={},
        cwd="/",
        route_flag=route_flag,
        include_plugin=True,
        host_kind="patched",
        model="/m",
        served_model_name="m",
        tp=4,
        host="127.0.0.1",
        port=8000,
        server_module="x",
        log_path="/l",
        report_dir="/r",
    )
    base.update(kw)
    return RunningState.model_validate(base)


def test_restart_needed_when_the_running_route_differs_from_desired() -> None:
    desired = DesiredState(awq_m1=False, model="/m")
    needed, reasons = restart_decision(desired, running("1"), "ready")
    assert needed and reasons[0].startswith("route: running on, desired off")
    assert restart_command(desired) == "qpnserve rollback --restart"


def test_no_restart_needed_when_running_matches_desired() -> None:
    desired = DesiredState(awq_m1=True, model="/m")
    assert restart_decision(desired, running("1"), "ready") == (False, [])
    assert restart_decision(desired, None, "not running") == (False, [])


def test_a_gone_server_needs_a_restart() -> None:
    needed, reasons = restart_decision(DesiredState(awq_m1=True), running(), "gone")
    assert needed and "not running any more" in reasons[0]


def test_ranks_that_disagree_on_the_layer_count_are_a_problem_without_a_checkpoint_count() -> None:
    reports = [report(0, layers=4), report(1, layers=4), report(2, layers=3), report(3, layers=4)]
    problems = route_problems(reports, tp=4, expected_layers=None, server_pids=set())
    assert problems == [
        "the ranks disagree on the MoE layer count: rank 0: 4, rank 1: 4, rank 2: 3, rank 3: 4"
    ]


def test_ranks_that_disagree_on_the_layer_count_are_named_beside_the_checkpoint_count() -> None:
    reports = [report(0, layers=49), report(1, layers=48), report(2, layers=48), report(3, 48)]
    problems = route_problems(reports, tp=4, expected_layers=48, server_pids=set())
    assert problems == [
        "the ranks disagree on the MoE layer count: rank 0: 49, rank 1: 48, rank 2: 48, rank 3: 48"
    ]
