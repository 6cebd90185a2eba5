"""`status` on a server that is gone says which process died first (from vLLM's own log line)
and what to run; on a live one it names every process of the server by pid and title."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qpnserve.lifecycle.postmortem import exit_cause
from qpnserve.lifecycle.procs import is_alive
from tests.lifecycle.conftest import Env, cli

# vLLM 0.32's executor monitor, verbatim in form (tests/e2e sees the real one).
WORKER_DIED = (
    "(EngineCore pid=4711) ERROR 12-01 19:40:02 [multiproc_executor.py:316] Worker proc "
    "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor."
)


@pytest.mark.parametrize(
    ("lines", "tp", "said"),
    [
        ([WORKER_DIED], 2, "worker TP1 died first (killed by signal 9)"),
        ([WORKER_DIED.replace("-9)", "1)")], 2, "worker TP1 died first (exit code 1)"),
        (
            [WORKER_DIED.replace("-1 died", "-5 died")],
            2,
            "VllmWorker-5 died first (killed by signal 9)",
        ),
        (
            ["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue"],
            2,
            "the engine core died first",
        ),
        (["INFO: Shutting down", "INFO: Finished server process"], 2, None),
    ],
)
def test_exit_cause_reads_which_process_died_first(
    lines: list[str], tp: int, said: str | None
) -> None:
    assert exit_cause(lines, tp) == said


def test_status_of_a_live_server_names_each_process_by_pid(env: Env) -> None:
    running = json.loads(cli("up", "--no-awq-m1", "--detach", "--tp", "2", "--json").stdout)
    status = json.loads(cli("status", "--json").stdout)
    titles = {p["pid"]: p["title"] for p in status["processes"]}
    assert titles[running["pid"]] == "API server"
    assert len(titles) == 3  # the stand-in and its two forked "workers"
    text = cli("status").stdout
    assert f"processes: {running['pid']} API server, " in text


def test_status_of_a_gone_server_says_what_died_first_and_what_to_run(env: Env) -> None:
    running = json.loads(cli("up", "--no-awq-m1", "--detach", "--tp", "2", "--json").stdout)
    with Path(running["log_path"]).open("a") as log:
        log.write(WORKER_DIED + "\n")
    pids = json.loads(cli("status", "--json").stdout)["group_pids"]
    os.killpg(running["pgid"], signal.SIGKILL)
    for _ in range(100):
        if not any(is_alive(pid, None) for pid in pids):
            break
        time.sleep(0.1)
    text = cli("status").stdout
    assert "GONE (exited; worker TP1 died first (killed by signal 9); record is stale)" in text
    assert "  run: qpnserve rollback --restart" in text
    status = json.loads(cli("status", "--json").stdout)
    assert status["exit_cause"] == "worker TP1 died first (killed by signal 9)"
    assert status["processes"] == []


def test_stand_in_worker_titles_are_read_from_the_process(tmp_path: Path) -> None:
    """The title is what the process set (setproctitle, as vLLM's workers do)."""
    code = (
        "import setproctitle, time\n"
        "setproctitle.setproctitle('VLLM::Worker_TP1')\n"
        "print(1, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
        from qpnserve.lifecycle.postmortem import server_processes

        seen = server_processes([proc.pid], leader=-1)
        assert [(p.pid, p.title) for p in seen] == [(proc.pid, "VLLM::Worker_TP1")]
    finally:
        proc.kill()
        proc.wait()
