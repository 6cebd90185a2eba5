"""One real vLLM server through its whole life, driven by the qpnserve CLI: `up --no-awq-m1
--detach` -> ready -> `status` -> the plugin idle in every vLLM process -> `bench smoke` C1 and
C4 twice -> `bench compare` -> a C4 cell released into one engine step (its single-token step
share) -> a second `up` on its port -> `down`. The tests run in file order
and share the server (one start costs 20+ s of the 2-core budget)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import plugin_probe
from tests.e2e.conftest import (
    Server,
    ensure_stopped,
    live,
    new_server,
    server_pids,
    wait_until_gone,
)

pytestmark = pytest.mark.e2e

OUTPUT_TOKENS = 24


@pytest.fixture(scope="module")
def server(scratch: Path, tiny_model: Path) -> Iterator[Server]:
    srv = new_server(scratch, tiny_model, "lifecycle")
    probe_site = scratch / "probe-site"
    plugin_probe.install(probe_site)
    srv.env["PYTHONPATH"] = os.pathsep.join([str(probe_site), srv.env["PYTHONPATH"]])
    srv.env["QPNSERVE_E2E_PROBE_DIR"] = str(scratch / "probe-records")
    srv.env["VLLM_PLUGINS"] = "qpnserve_e2e_probe"  # `up` keeps the user's names and adds its own
    # /pause and /resume (vLLM's dev-mode routes) and one "Added request" log line per request
    # let the C4 test queue its four requests and release them into one engine step.
    srv.env["VLLM_SERVER_DEV_MODE"] = "1"
    args = [*srv.up_args("--no-awq-m1", "--detach"), "--enable-log-requests"]
    srv.up_result = srv.cli(*args, timeout_s=600)
    yield srv
    ensure_stopped(srv)


def test_up_detached_returns_once_the_server_generates(server: Server) -> None:
    done = server.up_result
    assert done is not None and done.returncode == 0, done.stderr
    assert "ready at http://127.0.0.1:" in done.stderr
    assert "VLLM_SM70_AWQ_QWEN38_QPN_M1=0" in done.stderr
    body = {"model": server.model.name, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    resp = httpx.post(f"http://127.0.0.1:{server.port}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] >= 1


def test_status_shows_the_running_group_and_the_route_off(server: Server) -> None:
    done = server.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["server"] == "ready"
    assert status["healthy"] is True
    assert status["running"]["route_flag"] == "0"
    assert status["restart_needed"] is False
    # API server, EngineCore, worker (and multiprocessing's resource tracker): one group.
    assert len(status["group_pids"]) >= 3
    assert status["route_text"].startswith("off (")


def test_plugin_is_called_and_idle_in_every_vllm_process(server: Server, scratch: Path) -> None:
    records = [json.loads(p.read_text()) for p in (scratch / "probe-records").glob("*.json")]
    record = server.running_record()
    assert record is not None
    assert "qpnserve_e2e_probe,qpnserve_awq_m1" in server.up_result.stderr  # type: ignore[union-attr]
    # vLLM calls general plugins in its API server, EngineCore and worker (and in short-lived
    # helper processes the API server starts, gone by now); in each, qpnserve's plugin read
    # the flag `up` set and decided "off".
    leader = int(str(record["pid"]))
    by_name = {r["process"]: r["pid"] for r in records if r["pid"] != leader}
    assert leader in {r["pid"] for r in records}, records
    worker = next((n for n in by_name if n.startswith("VllmWorker")), None)
    assert "EngineCore" in by_name and worker is not None, records
    assert {by_name["EngineCore"], by_name[worker]} <= set(server_pids(leader))
    for r in records:
        assert r["qpnserve_plugin_imported"] is True, r
        assert r["decisions"] == [{"flag": "0", "route_on": False}], r
    # Off means no route report and no refusal, and not a line of its own in the log.
    assert list((server.state_dir / "reports").glob("*")) == []
    assert "qpnserve AWQ M1" not in server.log_text()


def _smoke(server: Server, out: Path) -> tuple[dict[str, Any], str]:
    done = server.cli(
        "bench",
        "smoke",
        "--concurrency",
        "1,4",
        "--output-tokens",
        str(OUTPUT_TOKENS),
        "--prompt-tokens",
        "64",
        "--out",
        str(out),
        timeout_s=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stderr


def _assert_cell(cell: dict[str, Any], concurrency: int, table: str) -> None:
    """What a 2-core server can always show: every request completed at the asked length. A
    decode window (a moment when every request of the wave was decoding) is not guaranteed:
    on 2 busy cores the API server may deliver a request's tokens in one burst after the
    engine ran, so one request can finish before another's first token arrives. Then the
    report must say why there is no pure figure instead of carrying a bare null."""
    assert cell["requests"] == cell["completed"] == concurrency, cell
    assert cell["failed"] == 0
    # ignore_eos: every stream is exactly the asked length, counted from vLLM's usage.
    assert [r["tokens_received"] for r in cell["per_request"]] == [OUTPUT_TOKENS] * concurrency
    assert cell["total_output_tokens"] == OUTPUT_TOKENS * concurrency
    # The engine's own step counts (vLLM's /metrics), which no client-side burst can blur.
    # A lone request is one prefill step and one single-token step per further token; the
    # C4 figure depends on how the four were scheduled (the next test pins that down).
    if concurrency == 1:
        assert (cell["engine_steps"], cell["single_token_steps"]) == (
            OUTPUT_TOKENS,
            OUTPUT_TOKENS - 1,
        )
        assert cell["single_token_step_share"] >= 0.9
    else:
        assert 0.0 <= cell["single_token_step_share"] <= 1.0, cell
    assert cell["draft_tokens"] is None  # this server does not speculate
    if cell["pure_decode_tok_s"] is not None:
        assert cell["window_s"] > 0 and cell["pure_decode_tok_s"] > 0, cell
        assert cell["window_note"] is None
    else:
        assert cell["windows"] == [None], cell
        reason = cell["window_note"]
        assert isinstance(reason, str) and reason, cell
        assert f"C{concurrency}: no decode window, so no pure tok/s: {reason}" in table


def test_bench_smoke_measures_c1_and_c4_at_a_fixed_length_twice_and_compares(
    server: Server, scratch: Path
) -> None:
    runs = [_smoke(server, scratch / name) for name in ("smoke-a.json", "smoke-b.json")]
    for report, table in runs:
        assert report["complete"] is True
        assert report["canary"]["passed"] is True
        assert report["canary"]["checked_streams"] == 2 * (1 + 4)  # warm-up and scored waves
        assert report["server"]["speculating"] is False
        assert report["server"]["speculation"].startswith(
            "speculation off (its /metrics counts no draft tokens): a decode step of one request "
            "schedules one token, the step the M=1 route serves; measured single-token step share"
        )
        assert report["server"]["speculation"] in table
        cells = {c["concurrency"]: c for c in report["cells"]}
        assert set(cells) == {1, 4}
        for concurrency, cell in cells.items():
            _assert_cell(cell, concurrency, table)
    done = server.cli(
        "bench", "compare", str(scratch / "smoke-a.json"), str(scratch / "smoke-b.json")
    )
    assert done.returncode == 0, done.stderr
    assert "C1" in done.stdout + done.stderr and "C4" in done.stdout + done.stderr


def _added_requests(server: Server) -> int:
    return server.log_text().count("Added request ")


def test_c4_cell_scheduled_together_has_no_single_token_step(server: Server) -> None:
    """The C4 share depends on the four requests being scheduled together, which a busy 2-core
    machine cannot promise on its own. So the engine is paused (vLLM's /pause, mode keep)
    until it holds all four ("Added request" is logged once a request is handed to the engine,
    ahead of the /resume sent after it), then resumed: the four are prefilled in one step and
    decode in lockstep to the same length, so no step can schedule a single token."""
    url = f"http://127.0.0.1:{server.port}"
    added_before = _added_requests(server)
    command = [sys.executable, "-m", "qpnserve", "bench", "smoke", "--url", url, "--json"]
    command += ["--concurrency", "4", "--warmup", "0", "--output-tokens", str(OUTPUT_TOKENS)]
    paused = httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60)
    assert paused.status_code == 200, paused.text
    smoke = subprocess.Popen(
        command, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while _added_requests(server) < added_before + 4:
            assert smoke.poll() is None, smoke.communicate()
            assert time.monotonic() < deadline, "the four C4 requests never reached the engine"
            time.sleep(0.2)
    finally:
        httpx.post(f"{url}/resume", timeout=60)
    out, err = smoke.communicate(timeout=300)
    assert smoke.returncode == 0, err
    (cell,) = json.loads(out)["cells"]
    assert cell["completed"] == 4 and cell["total_output_tokens"] == 4 * OUTPUT_TOKENS
    # One step prefilled all four, then one decode step per further token, four tokens each.
    assert (cell["engine_steps"], cell["single_token_steps"]) == (OUTPUT_TOKENS, 0)
    assert cell["single_token_step_share"] <= 0.1
    assert "C4: single-token step share 0.00 (0 of 24 engine steps)" in err
    status = json.loads(server.cli("status", "--json").stdout)
    assert status["single_token_step_share"] is not None
    assert status["steps_text"].startswith("single-token step share ")
    assert status["steps_text"].endswith(" engine steps since the server started)")
    assert status["speculation_text"].startswith("speculation off (its /metrics counts no draft")


def test_up_on_the_port_of_a_running_vllm_is_a_conflict(server: Server, scratch: Path) -> None:
    other = new_server(scratch, server.model, "port-clash")
    other.port = server.port
    done = other.cli(*other.up_args("--no-awq-m1", "--detach"))
    assert done.returncode == 4, done.stderr
    assert f"port {server.port} on 127.0.0.1 is already in use by pid" in done.stderr
    assert other.running_record() is None


def test_down_stops_every_process_of_the_group_and_clears_the_state(server: Server) -> None:
    record = server.running_record()
    assert record is not None
    pids = server_pids(int(str(record["pid"])))
    assert len(live(pids)) >= 3
    done = server.cli("down", "--timeout-s", "30")
    assert done.returncode == 0, done.stderr
    assert wait_until_gone(pids, timeout_s=5) == []
    assert server.running_record() is None
    status = json.loads(server.cli("status", "--json").stdout)
    assert status["server"] == "not running"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2)
