"""What `status` says about the server's processes: each one's title (vLLM names them
`VLLM::EngineCore`, `VLLM::Worker_TP0`, ...), and, once the server is gone, which process died
first, read from the server's log. Parsing is pure; reading /proc and the log is done by callers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel

from qpnserve.lifecycle.guards_probe import read_command


class ServerProcess(BaseModel):
    pid: int
    title: str  # "API server", "VLLM::EngineCore", "VLLM::Worker_TP1", or the command line


def server_processes(pids: Sequence[int], leader: int) -> list[ServerProcess]:
    """The live processes among ``pids``, titled; the leader is vLLM's API server (it keeps its
    command line as title when it runs alone)."""
    found = []
    for pid in sorted(pids):
        seen = read_command(pid)
        if seen is None:
            continue
        title = seen[0] if "::" in seen[0] else seen[1]
        found.append(ServerProcess(pid=pid, title="API server" if pid == leader else title))
    return found


# vLLM's executor logs which worker process died when its monitor sees it go
# ("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.");
# the engine client logs the engine core's death.
_WORKER_DIED = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+|None)\)")
_WORKER_RANK = re.compile(r"VllmWorker-(\d+)$")
_ENGINE_DIED = re.compile(r"Engine core proc (\S+) died unexpectedly|EngineDeadError")


def exit_cause(log_lines: Sequence[str], tp: int) -> str | None:
    """'worker TP1 died first (exit code -9, killed by signal 9)' from the log; None if the
    log does not say (then `status` says only that the server exited)."""
    for line in log_lines:
        match = _WORKER_DIED.search(line)
        if match:
            name, code = match.group(1), match.group(2)
            rank = _WORKER_RANK.match(name)
            who = f"worker TP{rank.group(1)}" if rank and int(rank.group(1)) < tp else name
            return f"{who} died first ({_exit_text(code)})"
    for line in log_lines:
        if _ENGINE_DIED.search(line):
            return "the engine core died first"
    return None


def _exit_text(code: str) -> str:
    if code == "None":
        return "exit code unknown"
    value = int(code)
    if value < 0:
        return f"killed by signal {-value}"
    return f"exit code {value}"
