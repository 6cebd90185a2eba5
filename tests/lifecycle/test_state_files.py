"""The state directory: owner-only, corrupt files reported clearly, the lock refuses a racer."""

from __future__ import annotations

import stat
import subprocess
import sys
import time

import pytest

from qpnserve.errors import ConflictError
from qpnserve.state import DesiredState, ensure_state_dir, locked, read_desired, write_desired
from tests.lifecycle.conftest import Env, cli


def test_corrupt_server_state_file_gives_a_clear_error_and_exit_6(env: Env) -> None:
    ensure_state_dir(env.state)
    env.server_json.write_text('{"phase": "ready", "pid": ')
    for args in (("status",), ("down",), ("up", "--detach")):
        result = cli(*args)
        assert result.exit_code == 6, args
        lines = result.stderr.strip().splitlines()
        assert lines[0].startswith(f"error: state file {env.server_json} is corrupt")
        assert lines[1].startswith("hint: inspect it")
        assert "Traceback" not in result.output


def test_desired_state_with_wrong_fields_is_reported_not_guessed(env: Env) -> None:
    ensure_state_dir(env.state)
    (env.state / "desired.json").write_text('{"awq_m1": "maybe"}')
    result = cli("status")
    assert result.exit_code == 6
    assert "desired.json is corrupt" in result.stderr


def test_state_dir_is_created_readable_only_by_its_owner(env: Env) -> None:
    assert cli("status").exit_code == 0
    assert stat.S_IMODE(env.state.stat().st_mode) == 0o700


def test_state_dir_readable_by_others_is_tightened(env: Env) -> None:
    env.state.mkdir(mode=0o755)
    env.state.chmod(0o755)
    ensure_state_dir(env.state)
    assert stat.S_IMODE(env.state.stat().st_mode) == 0o700


def test_lock_held_by_another_process_is_a_conflict_not_a_hang(env: Env) -> None:
    root = ensure_state_dir(env.state)
    holder_code = (
        "import sys, time\n"
        "from filelock import FileLock\n"
        "lock = FileLock(sys.argv[1])  # kept referenced: a dropped FileLock releases\n"
        "lock.acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(root / "state.lock")], stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with (
            pytest.raises(ConflictError, match="locked by another qpnserve command"),
            locked(root, timeout_s=0.2),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with locked(root, timeout_s=5):  # released with its holder
        pass


def test_a_reused_pid_is_never_taken_for_the_server(env: Env) -> None:
    """server.json names a pid that now belongs to another process (other start time):
    status says the server is gone, down signals nothing, up clears the record."""
    import json

    from qpnserve.lifecycle.procs import is_alive, start_ticks
    from qpnserve.state import RunningState, write_running

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(other.pid)
        assert ticks is not None
        record = RunningState.model_validate(
            {
                "phase": "ready",
                "pid": other.pid,
                "pgid": other.pid,
                "proc_start_ticks": ticks - 1,  # started at another time: not our server
                "started_at": "2026-01-01T00:00:00Z",
                "argv": [],
                "env": {},
                "cwd": "/",
                "route_flag": "1",
                "include_plugin": True,
                "host_kind": "patched",
                "model": str(env.model),
                "served_model_name": "m",
                "tp": 4,
                "host": "127.0.0.1",
                "port": env.port,
                "server_module": "x",
                "log_path": "/nonexistent.log",
                "report_dir": str(env.state / "reports"),
            }
        )
        write_running(ensure_state_dir(env.state), record)
        status = json.loads(cli("status", "--json").stdout)
        assert status["server"] == "gone"
        assert status["group_pids"] == []
        down = cli("down")
        assert down.exit_code == 0
        assert f"pid {other.pid} is no longer the recorded server" in down.stderr
        assert is_alive(other.pid, ticks)
        assert not env.server_json.exists()
    finally:
        other.kill()
        other.wait()


_WRITER = """
import sys, time
from pathlib import Path
from qpnserve.state import DesiredState, write_desired
root, seconds = Path(sys.argv[1]), float(sys.argv[2])
states = [DesiredState(awq_m1=on, extra_args=["--x"] * 4000) for on in (True, False)]
(root / "writer-started").touch()
deadline = time.monotonic() + seconds
n = 0
while time.monotonic() < deadline:
    write_desired(root, states[n % 2])
    n += 1
print(n)
"""


def test_a_reader_never_sees_a_state_file_half_written_by_another_process(env: Env) -> None:
    """Every write is a rename of a whole file: `status` in one terminal while `up` or
    `rollback` writes in another must read the old file or the new one, never a torn one."""
    root = ensure_state_dir(env.state)
    write_desired(root, DesiredState(awq_m1=True, extra_args=["--x"] * 4000))
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root), "2.0"], stdout=subprocess.PIPE, text=True
    )
    try:
        while not (root / "writer-started").exists():
            assert writer.poll() is None, "the writer died"
            time.sleep(0.01)
        seen = set()
        reads = 0
        while writer.poll() is None:
            desired = read_desired(root)  # raises StateError on a torn file
            assert desired is not None and len(desired.extra_args) == 4000
            seen.add(desired.awq_m1)
            reads += 1
    finally:
        out, _ = writer.communicate(timeout=30)
    assert writer.returncode == 0
    assert int(out) > 100 and reads > 100  # the two really overlapped
    assert seen == {True, False}
