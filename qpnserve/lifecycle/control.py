"""`down` and `status`: stop the recorded server's whole process group; report desired versus
running state without ever claiming more than was observed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from qpnserve import config
from qpnserve.auth import api_key_from_env
from qpnserve.errors import QpnError
from qpnserve.lifecycle.options import Progress, stderr_progress
from qpnserve.lifecycle.postmortem import ServerProcess, exit_cause, server_processes
from qpnserve.lifecycle.procs import descendants, group_members, is_alive, log_tail, stop_group
from qpnserve.lifecycle.route_check import (
    GraphSummary,
    RouteSummary,
    expected_moe_layers,
    graph_summary,
    summarize,
)
from qpnserve.route_report import read_reports
from qpnserve.route_sources import RouteValues, server_route_values
from qpnserve.state import (
    DesiredState,
    RunningState,
    clear_running,
    ensure_state_dir,
    locked,
    read_desired,
    read_running,
    write_running,
)

ServerPhase = Literal["not running", "starting", "ready", "stopping", "gone"]


class DownResult(BaseModel):
    stopped: bool  # False: nothing was recorded (or nothing was left to stop)
    pid: int | None = None
    pgid: int | None = None
    terminated: list[int] = Field(default_factory=list)  # group members when SIGTERM was sent
    killed: list[int] = Field(default_factory=list)  # still there after the grace period


def down(
    timeout_s: float = config.DEFAULT_STOP_TIMEOUT_S,
    progress: Progress | None = None,
    *,
    settings: config.Settings,
) -> DownResult:
    """SIGTERM the recorded server's group, wait ``timeout_s``, SIGKILL the rest, confirm, clear."""
    say = progress or stderr_progress
    root = ensure_state_dir(settings.state_dir)
    with locked(root):
        running = read_running(root)
        if running is None:
            return DownResult(stopped=False)
        leader_reused = (
            running.proc_start_ticks is not None
            and is_alive(running.pid, None)
            and not is_alive(running.pid, running.proc_start_ticks)
        )
        if leader_reused:
            # The pid now names another process (reuse); its group is not ours to signal.
            say(f"pid {running.pid} is no longer the recorded server; clearing the record")
            clear_running(root, running.pid)
            return DownResult(stopped=False, pid=running.pid, pgid=running.pgid)
        # Mark first: a foreground `up` that sees its server exit then knows it was asked to.
        write_running(root, running.model_copy(update={"phase": "stopping"}))
    members = group_members(running.pgid)
    if members:
        say(f"stopping the server: SIGTERM to process group {running.pgid} (pids {members})")
    try:
        outcome = stop_group(running.pgid, timeout_s, progress=say)
    finally:
        # The record follows what happened, also when Ctrl-C cut the grace period short
        # (stop_group kills the group, then re-raises): cleared once nothing of it is left.
        if not group_members(running.pgid) and not is_alive(running.pid, running.proc_start_ticks):
            with locked(root):
                clear_running(root, running.pid)
    if outcome.had_members:
        forced = f"; SIGKILL for {outcome.killed}" if outcome.forced else ""
        say(f"stopped: no process of group {running.pgid} is left{forced}")
    else:
        say(f"the recorded server (pid {running.pid}) was already gone; record cleared")
    return DownResult(
        stopped=bool(outcome.had_members),
        pid=running.pid,
        pgid=running.pgid,
        terminated=outcome.had_members,
        killed=outcome.killed,
    )


class StatusReport(BaseModel):
    state_dir: str
    desired: DesiredState | None
    running: RunningState | None
    server: ServerPhase
    group_pids: list[int] = Field(default_factory=list)  # live processes of the server's group
    processes: list[ServerProcess] = Field(default_factory=list)  # the same, with their titles
    exit_cause: str | None = None  # gone: which process died first, from the server's log
    healthy: bool | None = None  # None: not probed (nothing running)
    health_detail: str | None = None
    route: RouteSummary | None = None
    route_text: str | None = None
    route_graphs: GraphSummary | None = None  # does the route fire on single-token steps
    restart_needed: bool
    restart_reasons: list[str] = Field(default_factory=list)
    restart_command: str | None = None
    # Each route-related value of the running server with its source (qpnserve.route_sources).
    route_values: RouteValues | None = None
    # The user's own traffic since the server started (qpnserve.bench.steps): the share of
    # engine steps that processed one token, the only steps the M=1 route serves.
    single_token_step_share: float | None = None
    steps_text: str | None = None
    speculation_text: str | None = None  # qpnserve.speculation's line, from /metrics and argv


def status(probe_timeout_s: float = 2.0, *, settings: config.Settings) -> StatusReport:
    """Desired versus running, liveness from /proc, health from /health, route from reports."""
    root = ensure_state_dir(settings.state_dir)
    # No lock: every state write is an atomic rename, so a read sees a whole file, and status
    # must answer even while another command holds the lock.
    desired = read_desired(root)
    running = read_running(root)
    phase: ServerPhase = "not running"
    members: list[int] = []
    healthy: bool | None = None
    health_detail: str | None = None
    route: RouteSummary | None = None
    graphs: GraphSummary | None = None
    route_values: RouteValues | None = None
    processes: list[ServerProcess] = []
    cause: str | None = None
    if running is not None:
        alive = is_alive(running.pid, running.proc_start_ticks)
        reused = not alive and is_alive(running.pid, None)  # the pid names another process now
        members = [] if reused else group_members(running.pgid)
        phase = running.phase if alive else "gone"
        if alive:
            key = api_key_from_env(settings.environ)
            healthy, health_detail = _probe_health(running.base_url, probe_timeout_s, key)
        try:
            reports = read_reports(Path(running.report_dir))
            route = summarize(reports, running.tp, expected_moe_layers(Path(running.model)))
            graphs = graph_summary(reports, running.tp) if reports else None
        except QpnError as exc:
            health_detail = f"{health_detail or ''}; {exc.message}".lstrip("; ")
        live = [running.pid, *(m for m in members if m != running.pid)] if alive else []
        route_values = server_route_values(live, running.host_kind)
        pids = set(members) | ({s.pid for s in descendants(running.pid)} if alive else set())
        processes = server_processes(sorted(pids), running.pid)
        if phase == "gone":
            cause = exit_cause(log_tail(Path(running.log_path), 400, 1024 * 1024), running.tp)
    needed, reasons = restart_decision(desired, running, phase)
    if phase == "gone" and members:
        reasons.append(f"pids {members} of its process group remain: `qpnserve down` stops them")
    command = restart_command(desired) if needed else None
    share, steps_text, speculation_text = _steps(running, healthy, probe_timeout_s)
    return StatusReport(
        state_dir=str(root),
        desired=desired,
        running=running,
        server=phase,
        group_pids=members,
        processes=processes,
        exit_cause=cause,
        healthy=healthy,
        health_detail=health_detail,
        route=route,
        route_text=_route_text(running, route),
        route_graphs=graphs,
        restart_needed=needed,
        restart_reasons=reasons,
        restart_command=command,
        route_values=route_values,
        single_token_step_share=share,
        steps_text=steps_text,
        speculation_text=speculation_text,
    )


def _steps(
    running: RunningState | None, healthy: bool | None, timeout_s: float
) -> tuple[float | None, str | None, str | None]:
    """The share since start, its line, and speculation said plainly (None: not probed)."""
    if running is None or not healthy:
        return None, None, None
    from qpnserve.bench.steps import scrape_now, share_text, since_start
    from qpnserve.speculation import from_launch, from_server, route_meaning

    counters = scrape_now(running.base_url, timeout_s)
    share = since_start(counters)
    text = share_text(share, " since the server started")
    if isinstance(counters, str) or counters.missing:  # not vLLM's metrics: judge the launch
        spec = from_launch(running.argv, running.env)
    else:
        spec = from_server(share.speculating, running.argv)
    measured = None if share.share is None else f"single-token step share {share.share:.2f}"
    return share.share, text, route_meaning(spec, measured)


def _route_text(running: RunningState | None, route: RouteSummary | None) -> str | None:
    if running is None or route is None:
        return None
    if not running.awq_m1 and not route.ranks:
        return f"off ({config.ROUTE_FLAG.name}=0: the plugin stays idle and writes no report)"
    return route.text


def _probe_health(base_url: str, timeout_s: float, key: str | None) -> tuple[bool, str]:
    """/health (never guarded by a key), then /v1/models with $VLLM_API_KEY: a 401 there is
    said as a key problem, so `status` tells whether bench and verify will get through."""
    import httpx

    from qpnserve.auth import auth_headers, unauthorized_text

    try:
        resp = httpx.get(f"{base_url}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"/health: no answer ({type(exc).__name__})"
    detail = f"/health: HTTP {resp.status_code}"
    if resp.status_code != 200:
        return False, detail
    try:
        models = httpx.get(f"{base_url}/v1/models", timeout=timeout_s, headers=auth_headers(key))
    except httpx.HTTPError as exc:
        return True, f"{detail}; /v1/models: no answer ({type(exc).__name__})"
    if models.status_code == 401:
        return True, f"{detail}; {unauthorized_text(key, '/v1/models')}"
    return True, f"{detail}; /v1/models: HTTP {models.status_code}"


def restart_decision(
    desired: DesiredState | None, running: RunningState | None, phase: ServerPhase
) -> tuple[bool, list[str]]:
    """Does the running server differ from the desired state in a way only a restart fixes?"""
    if running is None:
        return False, []
    if phase == "gone":
        return True, [f"the recorded server (pid {running.pid}) is not running any more"]
    if desired is None or phase == "stopping":
        return False, []
    reasons = []
    running_on = running.awq_m1
    if desired.awq_m1 != running_on:
        reasons.append(
            f"route: running {'on' if running_on else 'off'}, desired "
            f"{'on' if desired.awq_m1 else 'off'} (CUDA graphs captured at start keep the "
            "route the server started with)"
        )
    if desired.include_plugin != running.include_plugin:
        reasons.append(
            f"plugin: running {'with' if running.include_plugin else 'without'} qpnserve's "
            f"plugin, desired {'with' if desired.include_plugin else 'without'}"
        )
    for name in ("model", "tp", "host", "port", "extra_args"):
        want, have = getattr(desired, name), getattr(running, name)
        if want is not None and want != have:
            reasons.append(f"{name}: running {have!r}, desired {want!r}")
    return bool(reasons), reasons


def restart_command(desired: DesiredState | None) -> str:
    if desired is None or desired.model is None:
        return "qpnserve down && qpnserve up --model PATH"
    if not desired.awq_m1:
        unpatch = " --unpatch" if not desired.include_plugin else ""
        return f"qpnserve rollback --restart{unpatch}"
    return "qpnserve down && " + shlex.join(up_argv(desired))


def up_argv(desired: DesiredState) -> list[str]:
    """The `qpnserve up` command line that starts ``desired`` (detached)."""
    argv = ["qpnserve", "up", "--awq-m1" if desired.awq_m1 else "--no-awq-m1"]
    argv += ["--model", desired.model or "PATH", "--tp", str(desired.tp)]
    argv += ["--host", desired.host, "--port", str(desired.port), "--detach"]
    if desired.served_model_name:
        argv += ["--served-model-name", desired.served_model_name]
    if desired.server_module:
        argv += ["--server-module", desired.server_module]
    if desired.extra_args:
        argv += ["--", *desired.extra_args]
    return argv
