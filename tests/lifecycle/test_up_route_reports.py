"""What `up` and `status` read from the rank reports, through the CLI, against the stand-in
server (not vLLM), whose workers write their reports through the plugin's RouteRecorder: the
layer count against the checkpoint's, and whether the route is in the 1-token graph."""

from __future__ import annotations

import json

import pytest

from tests.lifecycle.conftest import NUM_LAYERS, Env, cli, server_processes


def test_up_refuses_ranks_that_report_fewer_layers_than_the_checkpoint(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert NUM_LAYERS == 4  # the literal figures below
    monkeypatch.setenv("FAKE_HOST_LAYERS", "3")  # every rank agrees: only the checkpoint tells
    result = cli("up", "--detach")
    assert result.exit_code == 5, result.stderr
    assert (
        "the route is not on: rank 0: reports 3 MoE layers, the checkpoint has 4 quantized MoE "
        "layers" in result.stderr
    )
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_status_says_the_route_is_captured_in_the_1_token_graph(env: Env) -> None:
    up = cli("up", "--detach")
    assert up.exit_code == 0, up.stderr
    assert "graphs: route captured in the 1-token graph on 4/4 layers on 4/4 ranks" in up.stderr
    text = cli("status").stdout
    assert "graphs:   route captured in the 1-token graph on 4/4 layers on 4/4 ranks" in text
    graphs = json.loads(cli("status", "--json").stdout)["route_graphs"]
    assert graphs["fires_on_single_token"] is True
    assert graphs["state"] == "route_in_1_token_graph"
    assert [r["captured_rows"] for r in graphs["ranks"]] == [[1, 2, 4, 8]] * 4
    assert cli("down").exit_code == 0


def test_status_says_no_1_token_graph_was_captured(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_CAPTURE", "2,4")  # e.g. sizes rounded up for speculation
    assert cli("up", "--detach").exit_code == 0  # the route is admitted: the server serves
    graphs = json.loads(cli("status", "--json").stdout)["route_graphs"]
    assert graphs["fires_on_single_token"] is False
    assert graphs["text"] == (
        "no 1-token graph captured (smallest: 2 rows, on 4/4 ranks): single-token steps "
        "replay a padded graph, the route cannot fire"
    )
    assert cli("down").exit_code == 0
