"""The lifecycle fixture's teardown: a server a test left recorded is stopped with `qpnserve
down`, and a process that outlives that fails the test instead of being killed in silence."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.lifecycle.conftest import Env, cli, fail_on_leftovers, server_processes


def test_teardown_fails_a_test_that_leaks_a_process(env: Env) -> None:
    env.run_dir.mkdir(parents=True)
    leaked = subprocess.Popen(["sleep", "60"], cwd=env.run_dir, start_new_session=True)
    try:
        with pytest.raises(pytest.fail.Exception) as info:
            fail_on_leftovers(env)
        assert f"{leaked.pid} (sleep 60)" in str(info.value)
        assert leaked.wait(timeout=10) == -signal.SIGKILL  # and it is gone
    finally:
        if leaked.poll() is None:
            leaked.kill()
            leaked.wait()


def test_teardown_stops_a_server_left_recorded_and_passes(env: Env) -> None:
    assert cli("up", "--detach").exit_code == 0
    assert server_processes(env.run_dir)
    fail_on_leftovers(env)
    assert server_processes(env.run_dir) == {}
    assert not env.server_json.exists()
