"""`up`'s checks before anything starts, shared with `up --dry-run`: the options, the state
directory, a recorded server or anything else on the port, leftover vLLM processes and GPUs
already in use (guards.py), and the preflight (which judges the environment the server will get)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from qpnserve.config import ROUTE_FLAG, ROUTE_FLAG_VALUES, Settings
from qpnserve.errors import ConflictError, PreflightError
from qpnserve.host import HostInfo
from qpnserve.lifecycle.guards import judge, summary_lines
from qpnserve.lifecycle.guards_probe import gather_guard_facts
from qpnserve.lifecycle.launch import port_holder, port_in_use
from qpnserve.lifecycle.options import Progress, UpOptions, validate
from qpnserve.lifecycle.procs import group_members, is_alive
from qpnserve.lifecycle.stages import Stages
from qpnserve.state import clear_running, ensure_state_dir, locked, read_running


def checks_before_start(
    opts: UpOptions,
    server_env: Mapping[str, str],
    say: Progress,
    stages: Stages,
    dry_run: bool = False,
    *,
    settings: Settings,
) -> tuple[Path, HostInfo]:
    """`up`'s checks before anything starts; the preflight judges ``server_env``."""
    validate(opts)
    root = ensure_state_dir(settings.state_dir)
    with locked(root):
        check_conflicts(root, opts, say, dry_run)  # fail fast, before the slow stages
    guard_start(opts, server_env, say)
    host = stages.preflight(opts, judged_env(server_env, settings.environ), say, settings)
    if opts.awq_m1 and host.kind not in ("native", "patched"):
        raise PreflightError(
            f"the route needs a native or patchable 1Cat-vLLM host; found: {host.kind}",
            hint="run `qpnserve check --awq-m1` for details",
        )
    return root, host


def guard_start(opts: UpOptions, server_env: Mapping[str, str], say: Progress) -> None:
    """Refuse to start over leftover vLLM processes or processes holding memory on the GPUs the
    server will use (guards.py says which count); say what could not be known; warn on RAM."""
    facts = gather_guard_facts(server_env, opts.tp, opts.model_dir)
    verdict = judge(facts)
    for line in summary_lines(verdict, facts.prefix):
        say(line)
    if verdict.blockers:
        count = len(verdict.blockers)
        shown = "; ".join(b.text() for b in verdict.blockers[:4])
        more = f" (and {count - 4} more)" if count > 4 else ""
        raise ConflictError(
            f"{count} process{'es' if count > 1 else ''} would share the server's GPUs: "
            f"{shown}{more}",
            hint=f"stop them, then retry: {verdict.clear_command}",
        )


def judged_env(server_env: Mapping[str, str], user_env: Mapping[str, str]) -> Mapping[str, str]:
    """The environment the preflight judges: the server's, except that a route flag of the
    user's that no host accepts (`2`, `true`, ...) is kept, so that `up` FAILs it exactly as
    `check` does and refuses to start on that FAIL, instead of silently replacing it."""
    flag = ROUTE_FLAG.name
    value = user_env.get(flag)
    if value is None or value in ROUTE_FLAG_VALUES:
        return server_env
    return {**server_env, flag: value}


def check_conflicts(root: Path, opts: UpOptions, say: Progress, dry_run: bool = False) -> None:
    """A recorded server that lives, or anything on the port, is reported, never clobbered.
    The record of a server that is gone is cleared (a dry run only says it would be)."""
    running = read_running(root)
    if running is not None:
        leader_alive = is_alive(running.pid, running.proc_start_ticks)
        reused = not leader_alive and is_alive(running.pid, None)  # the pid names another process
        members = [] if reused else group_members(running.pgid)
        if leader_alive or members:
            what = "" if leader_alive else f" (leader gone, pids {members} of its group remain)"
            raise ConflictError(
                f"a server started by qpnserve is already running: pid {running.pid}, since "
                f"{running.started_at:%Y-%m-%d %H:%M:%S} UTC, route "
                f"{'on' if running.awq_m1 else 'off'}, {running.base_url}{what}",
                hint="`qpnserve status` shows it, `qpnserve down` stops it, "
                "`qpnserve rollback --restart` restarts it without the route",
            )
        if dry_run:
            say(f"up would clear the record of a server that is gone (pid {running.pid})")
        else:
            say(f"clearing the record of a server that is gone (pid {running.pid})")
            clear_running(root, running.pid)
    if port_in_use(opts.host, opts.port):
        holder = port_holder(opts.port)
        raise ConflictError(
            f"port {opts.port} on {opts.host} is already in use"
            + (f" by {holder}" if holder else ""),
            hint="stop what listens there, or pass another --port",
        )
