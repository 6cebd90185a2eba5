"""Live `verify` end to end: `verify` starts the server eagerly with the route on, arms and
sends the prompts, stops it and restores the desired state.

- Against the lifecycle stand-in (tests/support/fake_host.py, NOT vLLM), whose workers run no
  MoE layer: "nothing examined", exit 1, never a pass.
- Against the live-verify stand-in (tests/verify/standin_server.py, NOT vLLM), whose workers run
  the real plugin on the stand-in host class with the operator's CPU build: every (layer,
  prefix, rank, arm) captured and within the bounds (exit 0), and a broken bank preparation in
  one layer exits 7 naming that layer.
- A native host (VERIFY_STANDIN_HOST=native: the workers' host class is the native stand-in,
  whose hook calls the stand-in of the host's op): the route arm only, through the host's op,
  every sample within and every call served by the route; the host's broken preparation in one
  layer exits 7 naming it. Upstream vLLM (no route) is refused in test_cli_offline.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qpnserve import config
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
    assert "starts the server twice" in result.stderr  # the cost, said first
    assert "2 prompts captured" in result.stderr
    assert "stopping the route-off server" in result.stderr
    # the stand-in's completions do not depend on the route: identical, compared as text
    assert doc["quality"]["prompts"] == 2 and doc["quality"]["identical"] == 2
    assert doc["quality"]["with_logprobs"] is False
    assert server_processes(env.state / "run") == {}
    assert read_running(env.state) is None
    after = read_desired(env.state)
    assert after is not None and after.awq_m1 is False and after.extra_args == []


@pytest.fixture
def live_env(
    env: Env,  # noqa: F811
    cpu_extension: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Env:
    """The lifecycle stand-in's environment, with the live-verify stand-in server (the real
    plugin on the stand-in host class in every worker) and the CPU build of the operator."""
    monkeypatch.setenv(config.SERVER_MODULE.name, "tests.verify.standin_server")
    monkeypatch.setenv(config.BUILD_DIR.name, str(cpu_extension.path.parent.parent))
    monkeypatch.setenv(
        config.UP_TIMEOUT.name, "900"
    )  # a deadline on a shared CI box, not a measure
    monkeypatch.delenv("VERIFY_STANDIN_BREAK", raising=False)
    return env


def test_live_verify_end_to_end_passes_on_both_arms(live_env: Env, seeded_checkpoint: Path) -> None:
    result = cli(
        "verify", "--model", str(seeded_checkpoint), "--prefixes", "0,2", "--no-quality", "--json"
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    # 2 layers x 2 prefixes x 4 ranks x 2 arms, every one captured from the server's workers
    assert doc["counts"] == {"samples": 32, "within": 32, "outside": 0, "refused": 0}
    assert set(doc["arms"]) == {"route", "legacy"}
    assert doc["quality"] is None and "starts the server once" in result.stderr
    assert server_processes(live_env.state / "run") == {}
    assert read_running(live_env.state) is None


def test_live_verify_end_to_end_broken_preparation_exits_7_naming_the_layer(
    live_env: Env, seeded_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERIFY_STANDIN_BREAK", "1:zero-point-off-by-one")
    result = cli(
        "verify", "--model", str(seeded_checkpoint), "--prefixes", "1", "--no-quality", "--json"
    )
    assert result.exit_code == 7, result.stderr
    doc = json.loads(result.stdout)
    assert doc["worst"]["layer"] == 1
    assert {s["status"] for s in doc["samples"] if s["layer"] == 0} == {"within"}
    assert {s["status"] for s in doc["samples"] if s["layer"] == 1} == {"outside"}
    assert "worst layer 1" in result.stderr
    assert server_processes(live_env.state / "run") == {}


def test_live_verify_never_stops_a_server_it_did_not_start(env: Env) -> None:  # noqa: F811
    started = cli("up", "--detach", "--no-awq-m1")
    assert started.exit_code == 0, started.stderr
    try:
        result = cli("verify", "--model", str(env.model), "--no-quality")
        assert result.exit_code == 4, result.stderr
        running = read_running(env.state)
        assert running is not None and server_processes(env.state / "run")  # still serving
        desired = read_desired(env.state)
        assert desired is not None and desired.awq_m1 is False  # the user's, restored
    finally:
        assert cli("down").exit_code == 0


@pytest.fixture
def native_live_env(live_env: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """The live-verify stand-in with a native host: in the workers (the native stand-in class)
    and in the CLI's host facts (which a real native install would give)."""
    from qpnserve.host import HostInfo
    from qpnserve.preflight import gather

    native = HostInfo(found=True, dist_name="revolta", version="0.1.4", kind="native")
    monkeypatch.setattr(gather, "host_facts", lambda facts_file: native)
    monkeypatch.setenv("VERIFY_STANDIN_HOST", "native")
    return live_env


def test_live_verify_on_a_native_host_checks_the_host_op_and_what_it_served(
    native_live_env: Env, seeded_checkpoint: Path
) -> None:
    result = cli(
        "verify", "--model", str(seeded_checkpoint), "--prefixes", "0", "--no-quality", "--json"
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    # 2 layers x 1 prefix x 4 ranks x 1 arm (a native host has no legacy arm to compare)
    assert doc["counts"] == {"samples": 8, "within": 8, "outside": 0, "refused": 0}
    assert set(doc["arms"]) == {"route"}
    assert doc["served"] == {"checked": 8, "identical": 8}
    assert "_C::awq_moe_qpn_m1_sm70_out (native host revolta 0.1.4)" in doc["operator"]
    assert "x 1 arms = 8 samples" in result.stderr
    assert server_processes(native_live_env.state / "run") == {}
    assert read_running(native_live_env.state) is None


def test_live_verify_on_a_native_host_catches_its_broken_preparation(
    native_live_env: Env, seeded_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERIFY_STANDIN_BREAK", "0:gate-up-concat")
    result = cli(
        "verify", "--model", str(seeded_checkpoint), "--prefixes", "2", "--no-quality", "--json"
    )
    assert result.exit_code == 7, result.stderr
    doc = json.loads(result.stdout)
    assert doc["worst"]["layer"] == 0
    assert {s["status"] for s in doc["samples"] if s["layer"] == 1} == {"within"}
    assert server_processes(native_live_env.state / "run") == {}
