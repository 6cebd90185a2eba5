"""A real, separate `qpnserve up` process: Ctrl-C (SIGINT) and SIGTERM stop every process of the
server's group; `down` from another terminal ends a foreground `up` cleanly; two concurrent
`up` calls start one server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpnserve.lifecycle.procs import group_members
from tests.lifecycle.conftest import REPO_ROOT, Env, cli, server_processes
from tests.support.signals import default_sigint

WAIT_S = 20.0


def start_cli(*args: str) -> subprocess.Popen[str]:
    """`qpnserve ARGS` with the test stages, in its own session (a signal reaches only it).

    SIGINT starts at its default disposition: pytest run as a background job of a script
    inherits SIGINT ignored, and a Python started so never turns SIGINT into Ctrl-C.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "tests.lifecycle.stub_cli", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def wait_for_phase(server_json: Path, phase: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            state = json.loads(server_json.read_text())
            if state["phase"] == phase:
                return state
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"server.json never reached phase {phase!r}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_to_foreground_up_stops_every_process_of_the_group(
    env: Env, spawned: list, sig: signal.Signals
) -> None:
    up = start_cli("up")
    spawned.append(up)
    state = wait_for_phase(env.server_json, "ready")
    assert len(group_members(state["pgid"])) == 5
    up.send_signal(sig)
    _, err = up.communicate(timeout=WAIT_S)
    assert up.returncode == 130, err
    assert group_members(state["pgid"]) == []
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()


def test_ctrl_c_while_loading_stops_every_process_of_the_group(
    env: Env, spawned: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_LOAD_S", "60")
    up = start_cli("up")
    spawned.append(up)
    state = wait_for_phase(env.server_json, "starting")
    deadline = time.monotonic() + WAIT_S
    while len(group_members(state["pgid"])) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)  # the workers are forked while "loading"
    up.send_signal(signal.SIGINT)
    _, err = up.communicate(timeout=WAIT_S)
    assert up.returncode == 130, err
    assert "interrupted" in err
    assert group_members(state["pgid"]) == []
    assert not env.server_json.exists()


def test_server_dying_under_foreground_up_exits_5_and_stops_its_orphaned_workers(
    env: Env, spawned: list
) -> None:
    up = start_cli("up")
    spawned.append(up)
    state = wait_for_phase(env.server_json, "ready")
    os.kill(state["pid"], signal.SIGKILL)  # the API server dies; its 4 workers live on
    _, err = up.communicate(timeout=WAIT_S)
    assert up.returncode == 5, err
    assert "error: the server was killed by signal 9 while serving" in err
    assert group_members(state["pgid"]) == []
    assert not env.server_json.exists()


def test_down_from_another_terminal_ends_a_foreground_up_with_exit_0(
    env: Env, spawned: list
) -> None:
    up = start_cli("up")
    spawned.append(up)
    state = wait_for_phase(env.server_json, "ready")
    assert cli("down").exit_code == 0
    _, err = up.communicate(timeout=WAIT_S)
    assert up.returncode == 0, err
    assert "the server was stopped by `qpnserve down`" in err
    assert group_members(state["pgid"]) == []


def test_two_concurrent_up_calls_start_exactly_one_server(
    env: Env, spawned: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_LOAD_S", "0.5")
    ups = [start_cli("up", "--detach"), start_cli("up", "--detach")]
    spawned.extend(ups)
    outcomes = [(p.wait(timeout=WAIT_S * 2), p.communicate()[1]) for p in ups]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 4], outcomes
    loser = next(err for code, err in outcomes if code == 4)
    assert "already running" in loser or "already in use" in loser
    state = json.loads(env.server_json.read_text())
    assert set(server_processes(env.run_dir).values()) == {state["pgid"]}
    assert cli("down").exit_code == 0


def test_ctrl_c_during_down_kills_the_group_and_clears_the_record(
    env: Env, spawned: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_IGNORE_SIGTERM", "1")
    started = cli("up", "--detach", "--json")
    assert started.exit_code == 0, started.stderr
    running = json.loads(started.stdout)
    down = start_cli("down", "--timeout-s", "30")
    spawned.append(down)
    wait_for_phase(env.server_json, "stopping")
    time.sleep(0.5)  # down is now in its grace period: SIGTERM sent, ignored by the stand-in
    down.send_signal(signal.SIGINT)
    _, err = down.communicate(timeout=WAIT_S)
    assert down.returncode == 130, err
    assert group_members(running["pgid"]) == []
    assert not env.server_json.exists(), "the record must follow the killed group"
    assert "running:  no server" in cli("status").stdout
