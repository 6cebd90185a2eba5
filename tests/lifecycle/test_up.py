"""`qpnserve up`, end to end through the CLI, against the stand-in server process (not vLLM).

Each test starts a real process group (the stand-in and one forked "worker" per TP rank) on
127.0.0.1 and a free port, and checks /proc afterwards: no process of the group may be left.
"""

from __future__ import annotations

import json
import socket

import pytest

from qpnserve import config
from qpnserve.fixtures.checkpoint import write_checkpoint
from qpnserve.lifecycle.procs import group_members
from tests.lifecycle.conftest import NUM_LAYERS, Env, cli, environ_of, server_processes
from tests.lifecycle.stages import TEST_BUILD_KEY


def test_up_detach_serves_and_proves_the_route_on_every_rank(env: Env) -> None:
    result = cli("up", "--detach", "--json")
    assert result.exit_code == 0, result.stderr
    running = json.loads(result.stdout)
    assert running["phase"] == "ready"
    assert f"route: {NUM_LAYERS}/{NUM_LAYERS} layers admitted on 4/4 ranks" in result.stderr
    assert "started python -m tests.support.fake_host" in result.stderr
    assert "vllm" not in result.stderr.split("started python -m")[1].split("\n")[0]
    # 1 stand-in + 4 workers, all in the server's own process group
    assert len(group_members(running["pgid"])) == 5
    server_env = environ_of(running["pid"])
    assert server_env[config.ROUTE_FLAG.name] == "1"
    assert config.PLUGIN_NAME in server_env[config.VLLM_PLUGINS.name].split(",")
    assert server_env[config.REPORT_DIR.name] == str(env.state / "reports")
    assert running["build_key"] == TEST_BUILD_KEY
    assert running["host_kind"] == "patched"  # from the recorded facts the preflight read


def test_status_json_shows_ready_healthy_route_and_no_restart(env: Env) -> None:
    assert cli("up", "--detach").exit_code == 0
    status = json.loads(cli("status", "--json").stdout)
    assert status["server"] == "ready"
    assert status["healthy"] is True
    assert status["route_text"] == f"{NUM_LAYERS}/{NUM_LAYERS} layers admitted on 4/4 ranks"
    assert status["restart_needed"] is False
    assert status["desired"]["awq_m1"] is True
    assert status["running"]["route_flag"] == "1"


def test_down_leaves_no_process_of_the_group_and_clears_the_record(env: Env) -> None:
    running = json.loads(cli("up", "--detach", "--json").stdout)
    members = group_members(running["pgid"])
    assert len(members) == 5
    result = cli("down", "--json")
    assert result.exit_code == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["terminated"] == members
    assert outcome["killed"] == []
    assert group_members(running["pgid"]) == []
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()
    assert "running:  no server" in cli("status").stdout


def test_down_sigkills_a_group_that_ignores_sigterm(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_IGNORE_SIGTERM", "1")
    running = json.loads(cli("up", "--detach", "--json").stdout)
    outcome = json.loads(cli("down", "--timeout-s", "0.5", "--json").stdout)
    assert len(outcome["killed"]) == 5
    assert group_members(running["pgid"]) == []


def test_down_also_stops_a_worker_that_left_the_group(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_STRAY", "1")
    monkeypatch.setenv("FAKE_HOST_IGNORE_SIGTERM", "1")  # only qpnserve's own signals stop it
    running = json.loads(cli("up", "--detach", "--json").stdout)
    strays = [pid for pid, pgid in server_processes(env.run_dir).items() if pgid != running["pgid"]]
    assert len(strays) == 1
    outcome = json.loads(cli("down", "--timeout-s", "0.3", "--json").stdout)
    assert strays[0] in outcome["killed"]
    assert server_processes(env.run_dir) == {}


def test_up_crash_while_loading_exits_5_with_the_log_tail(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_CRASH_AFTER_S", "0.3")
    monkeypatch.setenv("FAKE_HOST_CRASH_CODE", "3")
    result = cli("up", "--detach")
    assert result.exit_code == 5
    assert "error: the server exited with status 3" in result.stderr
    assert "RuntimeError: stand-in crash while loading the model" in result.stderr
    # the crashed leader left its workers behind; up stopped them with the group
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()
    assert "Traceback" not in result.stderr.replace(
        "Traceback (most recent call last): (stand-in)", ""
    )


def test_up_times_out_when_the_server_never_becomes_healthy(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_NEVER_READY", "1")
    # 4 s: time enough for the stand-in to listen (and answer 503) even on a loaded CI machine
    result = cli("up", "--detach", "--timeout-s", "4")
    assert result.exit_code == 5
    assert "not ready after 4 s: waiting for /health" in result.stderr
    assert "HTTP 503" in result.stderr
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_up_stops_the_server_when_a_layer_is_not_admitted(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_REJECT", "2:3")
    result = cli("up", "--detach")
    assert result.exit_code == 5
    assert (
        "the route is not on: rank 2: layer model.language_model.layers.3.mlp.experts "
        "not admitted: sm70_w2_k_dim is 320" in result.stderr
    )
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_up_refuses_a_port_in_use_and_starts_nothing(env: Env) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", env.port))
        sock.listen(1)
        result = cli("up", "--detach")
    assert result.exit_code == 4
    assert f"error: port {env.port} on 127.0.0.1 is already in use" in result.stderr
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_up_refuses_while_a_recorded_server_is_alive(env: Env) -> None:
    first = json.loads(cli("up", "--detach", "--json").stdout)
    second = cli("up", "--detach")
    assert second.exit_code == 4
    assert f"already running: pid {first['pid']}" in second.stderr
    assert set(server_processes(env.run_dir).values()) == {first["pgid"]}


def test_up_after_a_server_killed_outside_qpnserve_clears_the_stale_record(env: Env) -> None:
    import os
    import signal
    import time

    first = json.loads(cli("up", "--detach", "--json").stdout)
    os.killpg(first["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_members(first["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    status = json.loads(cli("status", "--json").stdout)
    assert status["server"] == "gone"
    assert status["restart_needed"] is True
    second = cli("up", "--detach", "--json")
    assert second.exit_code == 0, second.stderr
    assert f"clearing the record of a server that is gone (pid {first['pid']})" in second.stderr


def test_preflight_failure_starts_nothing(env: Env, tmp_path) -> None:
    bad = write_checkpoint(tmp_path / "g128", "group-128", NUM_LAYERS)
    result = cli("up", "--detach", "--model", str(bad))
    assert result.exit_code == 1
    assert "error: preflight failed: checkpoint." in result.stderr
    assert not env.run_dir.exists() or server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_up_keeps_the_users_plugins_and_adds_its_own(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # preflight judges the server's environment, where up has already added its plugin
    monkeypatch.setenv(config.VLLM_PLUGINS.name, "site_plugin")
    monkeypatch.setenv(config.ROUTE_FLAG.name, "0")
    result = cli("up", "--detach", "--awq-m1", "--json")
    assert result.exit_code == 0, result.stderr
    server_env = environ_of(json.loads(result.stdout)["pid"])
    assert server_env[config.VLLM_PLUGINS.name] == f"site_plugin,{config.PLUGIN_NAME}"
    assert server_env[config.ROUTE_FLAG.name] == "1"
    assert f"note: {config.ROUTE_FLAG.name}=0 in your environment is replaced by 1" in (
        result.stderr
    )


def test_preflight_still_fails_on_a_variable_the_server_would_inherit(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SM70_AWQ_MOE_DISABLE", "1")
    result = cli("up", "--detach", "--awq-m1")
    assert result.exit_code == 1
    assert (
        "error: preflight failed: toolchain.host_env: VLLM_SM70_AWQ_MOE_DISABLE=1" in result.stderr
    )
    assert not env.server_json.exists()


def test_dry_run_prints_command_and_environment_and_starts_nothing(env: Env) -> None:
    result = cli("up", "--dry-run", "--", "--max-num-seqs", "4", "--enable-prefix-caching")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"{config.ROUTE_FLAG.name}=1" in lines
    command = lines[-1]
    assert " -m tests.support.fake_host --model " in command
    assert "--max-num-seqs 4" in command and "--max-num-seqs 8" not in command
    assert "--no-enable-prefix-caching" not in command and command.endswith(
        "--enable-prefix-caching"
    )
    assert "--attention-backend FLASH_ATTN_V100" in command
    assert not env.server_json.exists()
    assert not (env.state / "desired.json").exists()


def test_up_refuses_extra_args_that_change_what_it_probes(env: Env) -> None:
    result = cli("up", "--dry-run", "--", "--port", "9999")
    assert result.exit_code == 2
    assert "pass --port as qpnserve's own option" in result.stderr
