"""Processes and process groups, read from /proc: is our server alive, who is left in its group,
and the stop sequence SIGTERM -> wait -> SIGKILL -> confirm nothing is left.

Why the whole group: SIGKILL of only vLLM's API server leaves the engine core and every TP
worker alive and holding GPU memory (vllm#55510); the group reaches all of them.
Zombies are not counted as left: they hold no memory and vanish when their parent reaps them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qpnserve.errors import ServerError

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # R, S, D, Z, T, ...
    ppid: int
    pgid: int
    start_ticks: int

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """Fields of /proc/<pid>/stat; None if the process does not exist (or no /proc)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), start_ticks=int(rest[19])
    )


def all_stats() -> list[ProcStat]:
    if not has_proc():
        return []
    stats = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                stats.append(stat)
    return stats


def descendants(pid: int) -> list[ProcStat]:
    """Every live process below ``pid`` in the parent tree, whatever its process group."""
    children: dict[int, list[ProcStat]] = {}
    for stat in all_stats():
        children.setdefault(stat.ppid, []).append(stat)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.live:
                found.append(child)
            todo.append(child.pid)
    return found


def has_proc() -> bool:
    return (_PROC / "self" / "stat").exists()


def start_ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.start_ticks if stat else None


def is_alive(pid: int, expected_start_ticks: int | None) -> bool:
    """True if ``pid`` runs, is not a zombie, and (when known) started when we recorded it."""
    if not has_proc():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return expected_start_ticks is None or stat.start_ticks == expected_start_ticks


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``."""
    if not has_proc():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return sorted(s.pid for s in all_stats() if s.pgid == pgid and s.live)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@dataclass
class StopOutcome:
    had_members: list[int] = field(default_factory=list)  # live when the stop began
    killed: list[int] = field(default_factory=list)  # still there after the grace period

    @property
    def forced(self) -> bool:
        return bool(self.killed)


class _Targets:
    """The server's process group, plus any descendant of its leader that left the group
    (called setsid or setpgid): signalling the group alone would miss those."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        strays = [s for s in descendants(pgid) if s.pgid != pgid] if has_proc() else []
        self.strays = {s.pid: s.start_ticks for s in strays}

    def alive(self) -> list[int]:
        strays = [pid for pid, ticks in self.strays.items() if is_alive(pid, ticks)]
        return sorted(set(group_members(self.pgid) + strays))

    def signal(self, sig: signal.Signals) -> None:
        _signal_group(self.pgid, sig)
        for pid, ticks in self.strays.items():
            if is_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def wait_empty(self, timeout_s: float, poll_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        alive = self.alive()
        while alive and time.monotonic() < deadline:
            time.sleep(poll_s)
            alive = self.alive()
        return alive


def stop_group(
    pgid: int,
    timeout_s: float,
    *,
    poll_s: float = 0.1,
    progress: Callable[[str], None] | None = None,
    reap: Callable[[], object] | None = None,
) -> StopOutcome:
    """SIGTERM the group (and any stray descendant of its leader), wait up to ``timeout_s``,
    SIGKILL what remains, confirm nothing is left.

    ``reap`` lets a parent collect its own child (the group leader) while waiting. A second
    Ctrl-C during the grace period skips the rest of it: SIGKILL at once, then re-raise.
    Raises ServerError if processes survive SIGKILL (e.g. stuck in the kernel).
    """
    targets = _Targets(pgid)
    outcome = StopOutcome(had_members=targets.alive())
    if not outcome.had_members:
        return outcome
    targets.signal(signal.SIGTERM)
    interrupted = False
    try:
        remaining = targets.wait_empty(timeout_s, poll_s)
    except KeyboardInterrupt:
        interrupted = True
        remaining = targets.alive()
    if reap:
        reap()
    if remaining:
        if progress:
            pids = ", ".join(map(str, remaining))
            progress(f"process group {pgid} still has pid {pids}: sending SIGKILL")
        outcome.killed = remaining
        targets.signal(signal.SIGKILL)
        remaining = targets.wait_empty(5.0, poll_s)
        if reap:
            reap()
    if remaining:
        raise ServerError(
            f"pids {', '.join(map(str, remaining))} of process group {pgid} survived SIGKILL",
            hint="they may be stuck in the GPU driver; check `nvidia-smi` and `ps -o pid,stat,"
            f"cmd -g {pgid}`",
        )
    if interrupted:
        raise KeyboardInterrupt
    return outcome


def log_tail(path: Path, num_lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``num_lines`` non-empty lines of a log, reading at most ``max_bytes``."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    # tqdm-style progress bars rewrite one line with carriage returns: keep the last state.
    lines = [ln.rsplit("\r", 1)[-1] for ln in data.decode("utf-8", "replace").splitlines()]
    return [ln for ln in lines if ln.strip()][-num_lines:]


def read_environ(pid: int | None) -> dict[str, str]:
    """The environment ``pid`` started with ({} when gone or not readable: another user)."""
    if pid is None:
        return {}
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
