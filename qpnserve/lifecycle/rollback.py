"""`rollback`: the desired route goes off (and with ``unpatch`` the plugin goes out) for the next
start. A running server keeps the route it started with: vLLM captured its decode CUDA graphs
with the route's kernel at start, and a running process never re-reads the flag. So rollback
says "restart needed" and shows how, or with ``restart`` does `down` then `up` (detached).
Rolling back twice is harmless: the second call changes nothing and restarts nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from qpnserve import config
from qpnserve.auth import api_key_from_env
from qpnserve.errors import UsageError
from qpnserve.lifecycle.control import down, restart_command, restart_decision
from qpnserve.lifecycle.options import Progress, UpOptions, stderr_progress
from qpnserve.lifecycle.procs import is_alive
from qpnserve.lifecycle.stages import Stages
from qpnserve.lifecycle.up import up
from qpnserve.state import (
    DesiredState,
    RunningState,
    ensure_state_dir,
    locked,
    read_desired,
    read_running,
    write_desired,
)

GRAPHS_REASON = (
    "its CUDA graphs were captured with the route at start and a running process cannot "
    "replace them"
)


class RollbackResult(BaseModel):
    desired: DesiredState
    changed: bool  # False when the desired state already had the route off (and plugin out)
    running_pid: int | None = None
    running_route_on: bool | None = None
    restart_needed: bool
    restart_command: str | None = None
    restarted: RunningState | None = None
    notes: list[str] = Field(default_factory=list)  # the user-facing lines, in order


def rollback(
    restart: bool = False,
    unpatch: bool = False,
    stop_timeout_s: float = config.DEFAULT_STOP_TIMEOUT_S,
    up_timeout_s: float = config.DEFAULT_UP_TIMEOUT_S,
    progress: Progress | None = None,
    stages: Stages | None = None,
    *,
    settings: config.Settings,
) -> RollbackResult:
    say = progress or stderr_progress
    root = ensure_state_dir(settings.state_dir)
    with locked(root):
        before = read_desired(root)
        running = read_running(root)
        base = before or _desired_from_running(running)
        after = base.model_copy(
            update={
                "awq_m1": False,
                "include_plugin": base.include_plugin and not unpatch,
                "updated_at": datetime.now(UTC),
            }
        )
        changed = before is None or (before.awq_m1, before.include_plugin) != (
            after.awq_m1,
            after.include_plugin,
        )
        write_desired(root, after)
    alive = running is not None and is_alive(running.pid, running.proc_start_ticks)
    phase = "not running" if running is None else (running.phase if alive else "gone")
    needed, _ = restart_decision(after, running, phase) if alive else (False, [])
    result = RollbackResult(
        desired=after,
        changed=changed,
        running_pid=running.pid if alive and running else None,
        running_route_on=running.awq_m1 if alive and running else None,
        restart_needed=needed,
        restart_command=restart_command(after) if needed else None,
    )
    plugin = "" if after.include_plugin else ", qpnserve's plugin left out"
    if changed:
        result.notes.append(f"route: off for the next start{plugin} (desired state saved)")
    else:
        result.notes.append(f"route: already off for the next start{plugin}; nothing changed")
    if not alive or running is None:
        result.notes.append("no server is running: the next `qpnserve up` starts without the route")
        return _emit(result, say)
    if not needed:
        result.notes.append(
            f"the running server (pid {running.pid}) already runs without the route; "
            "restart needed: no"
        )
        return _emit(result, say)
    if running.awq_m1:
        result.notes.append(
            f"the running server (pid {running.pid}, {running.base_url}) keeps the AWQ M1 route "
            f"until it restarts: {GRAPHS_REASON}"
        )
    if not restart:
        result.notes.append(f"restart needed: yes; run: {result.restart_command}")
        return _emit(result, say)
    _emit(result, say)
    if after.model is None:
        raise UsageError(
            "cannot restart: the desired state names no model", hint="run `qpnserve up`"
        )
    if after.api_key_set and not api_key_from_env(settings.environ):
        raise UsageError(
            "cannot restart: the server was started with an API key, which qpnserve does not "
            f"store, and {config.API_KEY.name} is not set (the new server would serve without one)",
            hint=f"export {config.API_KEY.name} with the key, then run the command again",
        )
    say("restarting without the route: down, then up (detached)")
    down(stop_timeout_s, say, settings=settings)
    opts = UpOptions(
        **after.spec_fields(),
        detach=True,
        timeout_s=up_timeout_s,
        stop_timeout_s=stop_timeout_s,
    )
    result.restarted = up(opts, say, stages, settings=settings)
    result.restart_needed = False
    result.restart_command = None
    result.notes.append(
        f"restarted without the route: pid {result.restarted.pid}; restart needed: no"
    )
    say(result.notes[-1])
    return result


def _desired_from_running(running: RunningState | None) -> DesiredState:
    if running is None:
        return DesiredState(awq_m1=False)
    return DesiredState(**running.spec_fields(), api_key_set=running.api_key_set)


def _emit(result: RollbackResult, say: Progress) -> RollbackResult:
    for note in result.notes:
        say(note)
    return result
