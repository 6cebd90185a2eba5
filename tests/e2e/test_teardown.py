"""The end-to-end teardown fails a test that leaks a server process instead of killing it in
silence (no vLLM needed: the leak here is a plain process in the server's working directory)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, ensure_stopped


def test_teardown_fails_a_test_that_leaks_a_server_process(tmp_path: Path) -> None:
    server = Server(env={}, state_dir=tmp_path / "state", model=tmp_path, port=0)
    run_dir = server.state_dir / "run"  # where `up` starts the server
    run_dir.mkdir(parents=True)
    leaked = subprocess.Popen(["sleep", "60"], cwd=run_dir, start_new_session=True)
    try:
        with pytest.raises(pytest.fail.Exception) as info:
            ensure_stopped(server)
        assert f"{leaked.pid} (sleep 60)" in str(info.value)
        assert leaked.wait(timeout=10) == -signal.SIGKILL
    finally:
        if leaked.poll() is None:
            leaked.kill()
            leaked.wait()


def test_teardown_of_a_server_that_left_nothing_passes(tmp_path: Path) -> None:
    ensure_stopped(Server(env={}, state_dir=tmp_path / "state", model=tmp_path, port=0))
