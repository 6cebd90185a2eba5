"""Live `verify` end to end against the stand-in server (tests/support/fake_host.py, NOT vLLM):
it starts the server eagerly with the route on, sends the prompts, stops it, restores the
desired state, and, since the stand-in's workers run no MoE layer, reports that nothing was
examined (exit 1), never a pass. The numerics of the capture are tested in process
(test_live_capture.py); upstream vLLM (no route) is refused before anything starts."""

from __future__ import annotations

import json

from qpnserve.state import DesiredState, read_desired, read_running, write_desired
from tests.lifecycle.conftest import Env, checkpoint, cli, env, server_processes  # noqa: F401


def test_live_verify_on_the_stand_in_examines_nothing_and_leaves_no_server(
    env: Env,  # noqa: F811
) -> None:
    env.state.mkdir(parents=True, exist_ok=True)
    before = DesiredState(awq_m1=False, model=str(env.model), port=env.port)
    write_desired(env.state, before)
    result = cli(
        "verify", "--model", str(env.model), "--layers", "0", "--prefixes", "0,2", "--json"
    )
    assert result.exit_code == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["mode"] == "live" and doc["verdict"] == "nothing examined"
    # 1 layer x 2 prefixes x 4 ranks x 2 arms, none captured
    assert doc["counts"] == {"samples": 16, "within": 0, "outside": 0, "refused": 16}
    assert {s["reason"] for s in doc["samples"]} == {"not captured: no admitted one-token call"}
    assert "starts the server once (eager" in result.stderr  # the cost, said first
    assert "2 prompts served; stopping the server" in result.stderr
    assert server_processes(env.state / "run") == {}
    assert read_running(env.state) is None
    after = read_desired(env.state)
    assert after is not None and after.awq_m1 is False and after.extra_args == []


def test_live_verify_refuses_a_native_host_before_starting(
    env: Env,  # noqa: F811
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from qpnserve.preflight import gather
    from qpnserve.preflight.facts import HostFacts

    native = HostFacts(found=True, dist_name="revolta", version="0.1.4", kind="native")
    monkeypatch.setattr(gather, "host_facts", lambda: native)
    result = cli("verify", "--model", str(env.model))
    assert result.exit_code == 1
    assert "native host (revolta 0.1.4) is not in this build" in result.stderr
    assert read_running(env.state) is None
