"""`bench ab` end to end: the real lifecycle stages start the stand-in host (tests/support/
fake_host.py, NOT vLLM) with the route off, then on, and the real client measures both.

The lifecycle tests' fixtures give a private state dir, a free 127.0.0.1 port, recorded
healthy-V100 facts, a synthetic checkpoint and a teardown that kills any leftover process.
"""

from __future__ import annotations

import json

from qpnserve.state import read_desired
from tests.lifecycle.conftest import Env, checkpoint, cli, env, server_processes

__all__ = ["checkpoint", "env"]  # fixtures, re-used from the lifecycle tests

SMOKE_ARGS = ("--concurrency", "1,2", "--output-tokens", "6", "--warmup", "0")


def test_ab_measures_both_arms_and_leaves_nothing_running(env: Env) -> None:
    out_dir = env.state / "ab"
    result = cli("bench", "ab", *SMOKE_ARGS, "--out-dir", str(out_dir), "--json")
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.stdout)
    assert [c["concurrency"] for c in comparison["cells"]] == [1, 2]
    off = json.loads((out_dir / "route-off.json").read_text())
    on = json.loads((out_dir / "route-on.json").read_text())
    assert off["server"]["route"].startswith("VLLM_SM70_AWQ_QWEN38_QPN_M1=0")
    assert on["server"]["route"].startswith("VLLM_SM70_AWQ_QWEN38_QPN_M1=1")
    assert off["canary"]["passed"] and on["canary"]["passed"]
    assert off["settings"]["prompt"]["sha256"] == on["settings"]["prompt"]["sha256"]
    assert "fake" in on["server"]["version"]  # the stand-in names itself; never "vLLM"
    assert server_processes(env.run_dir) == {}  # nothing was running before: nothing now
    assert read_desired(env.state) is None


def test_ab_restarts_the_route_off_server_it_found(env: Env) -> None:
    assert cli("up", "--no-awq-m1", "--detach").exit_code == 0
    result = cli("bench", "ab", *SMOKE_ARGS, "--out-dir", str(env.state / "ab"))
    assert result.exit_code == 0, result.output
    status = json.loads(cli("status", "--json").stdout)
    assert status["server"] == "ready" and status["running"]["route_flag"] == "0"
    assert status["desired"]["awq_m1"] is False and status["restart_needed"] is False
    assert cli("down").exit_code == 0


def test_smoke_without_url_measures_the_server_qpnserve_started(env: Env) -> None:
    assert cli("up", "--detach").exit_code == 0
    try:
        result = cli("bench", "smoke", *SMOKE_ARGS, "--json")
    finally:
        assert cli("down").exit_code == 0
    assert result.exit_code == 0, result.output
    assert f"using the server qpnserve started: http://127.0.0.1:{env.port}" in result.stderr
    assert json.loads(result.stdout)["server"]["url"] == f"http://127.0.0.1:{env.port}"
