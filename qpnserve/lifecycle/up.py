"""`up`: start the server safely, prove it serves (and, with the route on, that every rank
admitted every MoE layer), record it, then serve in the foreground or return (detach)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from qpnserve import config
from qpnserve.errors import ConflictError, PreflightError, ServerError, UsageError
from qpnserve.launch import (
    DEFAULT_SERVER_MODULE,
    build_argv,
    build_env,
    default_python,
    installed_general_plugins,
    port_holder,
    port_in_use,
    route_env_record,
    start_server,
)
from qpnserve.lifecycle import options
from qpnserve.lifecycle.options import Progress, Stages, UpOptions, stderr_progress
from qpnserve.procs import group_members, is_alive, log_tail, start_ticks, stop_group
from qpnserve.readiness import wait_ready
from qpnserve.route_check import expected_moe_layers, route_problems, summarize
from qpnserve.route_report import read_reports
from qpnserve.state import (
    DesiredState,
    RunningState,
    clear_running,
    ensure_state_dir,
    locked,
    logs_dir,
    read_running,
    report_dir,
    write_desired,
    write_running,
)


@dataclass(frozen=True)
class LaunchPlan:
    """What `up` would start: `--dry-run` prints it, `up` runs it."""

    argv: list[str]
    env: dict[str, str]  # the full environment of the server
    recorded_env: dict[str, str | None]  # the variables that decide the route
    cwd: Path
    log_path: Path
    report_dir: Path


def plan_launch(
    opts: UpOptions,
    root: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    installed_plugins: Sequence[str] | None = None,
) -> LaunchPlan:
    validate(opts)
    reports = report_dir(root)
    env = build_env(
        os.environ if base_env is None else base_env,
        route_on=opts.awq_m1,
        include_plugin=opts.include_plugin,
        report_dir=reports,
        installed_plugins=(
            installed_general_plugins() if installed_plugins is None else installed_plugins
        ),
    )
    argv = build_argv(
        python=default_python(),
        server_module=opts.server_module,
        model=opts.model.resolve(),
        served_model_name=opts.served_name,
        tp=opts.tp,
        host=opts.host,
        port=opts.port,
        extra_args=opts.extra_args,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_path = logs_dir(root) / f"server-{stamp}-{os.getpid()}.log"
    # The host's instructions: run from a directory outside any source checkout, so the
    # checkout's `vllm/` folder cannot shadow the installed package.
    return LaunchPlan(argv, env, route_env_record(env), root / "run", log_path, reports)


def validate(opts: UpOptions) -> None:
    if not opts.model.is_dir():
        raise UsageError(f"--model {opts.model} is not a directory", hint="pass the checkpoint dir")
    if opts.tp < 1:
        raise UsageError(f"--tp must be at least 1, got {opts.tp}")
    if not 1 <= opts.port <= 65535:
        raise UsageError(f"--port must be 1..65535, got {opts.port}")
    if opts.timeout_s <= 0:
        raise UsageError(f"--timeout-s must be positive, got {opts.timeout_s}")
    if opts.awq_m1 and not opts.include_plugin:
        raise UsageError(
            "the route needs qpnserve's plugin: it applies the dispatch and writes the proof",
            hint="drop --unpatch, or start with --no-awq-m1",
        )


def up(
    opts: UpOptions, progress: Progress | None = None, stages: Stages | None = None
) -> RunningState:
    """Start the server; return its state once ready (detach) or once it stopped (foreground).

    Foreground: returns when `qpnserve down` stopped the server; raises ServerError if it exits
    on its own, KeyboardInterrupt (after stopping the group) on Ctrl-C or SIGTERM.
    """
    say = progress or stderr_progress
    stages = stages or options.default_stages()  # looked up per call: tests replace it
    validate(opts)
    root = ensure_state_dir()
    with locked(root):
        check_conflicts(root, opts, say)  # fail fast, before the slow stages
    host = stages.preflight(opts, say)
    if opts.awq_m1 and host.kind not in ("native", "patched"):
        raise PreflightError(
            f"the route needs a native or patchable 1Cat-vLLM host; found: {host.kind}",
            hint="run `qpnserve check --awq-m1` for details",
        )
    build_key = (
        stages.prepare_extension(host, say) if opts.awq_m1 and host.kind == "patched" else None
    )
    plan = plan_launch(opts, root)
    with locked(root):
        check_conflicts(root, opts, say)
        for stale in plan.report_dir.glob("route-rank*.json"):
            stale.unlink()  # a report of an earlier server must never prove this one
        write_desired(root, desired_from(opts))
        popen = start_server(plan.argv, plan.env, plan.cwd, plan.log_path)
        running = RunningState(
            phase="starting",
            pid=popen.pid,
            pgid=popen.pid,  # start_new_session: the server leads its own group
            proc_start_ticks=start_ticks(popen.pid),
            started_at=datetime.now(UTC),
            argv=plan.argv,
            env=plan.recorded_env,
            cwd=str(plan.cwd),
            route_flag="1" if opts.awq_m1 else "0",
            include_plugin=opts.include_plugin,
            host_kind=host.kind,
            host_version=host.version,
            build_key=build_key,
            model=str(opts.model.resolve()),
            served_model_name=opts.served_name,
            tp=opts.tp,
            host=opts.host,
            port=opts.port,
            extra_args=list(opts.extra_args),
            server_module=opts.server_module,
            log_path=str(plan.log_path),
            report_dir=str(plan.report_dir),
        )
        write_running(root, running)
    flag = config.ROUTE_FLAG.name
    say(f"started python -m {opts.server_module} (pid {popen.pid}, its own process group)")
    say(f"  {flag}={running.route_flag}  VLLM_PLUGINS={plan.env[config.VLLM_PLUGINS.name]}")
    say(f"  log: {plan.log_path}")
    try:
        with _sigterm_as_interrupt():
            _await_ready(popen, running, root, opts, say)
            running = _verify_and_record(popen, running, root, opts, say)
            if opts.detach:
                say(f"ready at {running.base_url} (detached; `qpnserve down` stops it)")
                return running
            return _serve_foreground(popen, running, root, say)
    except BaseException:
        _stop_after_failure(popen, running, root, opts, say)
        raise


def desired_from(opts: UpOptions) -> DesiredState:
    return DesiredState(
        awq_m1=opts.awq_m1,
        include_plugin=opts.include_plugin,
        model=str(opts.model.resolve()),
        served_model_name=opts.served_model_name,
        tp=opts.tp,
        host=opts.host,
        port=opts.port,
        extra_args=list(opts.extra_args),
        server_module=None if opts.server_module == DEFAULT_SERVER_MODULE else opts.server_module,
    )


def check_conflicts(root: Path, opts: UpOptions, say: Progress) -> None:
    """A recorded server that lives, or anything on the port, is reported, never clobbered."""
    running = read_running(root)
    if running is not None:
        leader_alive = is_alive(running.pid, running.proc_start_ticks)
        members = group_members(running.pgid)
        if leader_alive or members:
            what = "" if leader_alive else f" (leader gone, pids {members} of its group remain)"
            raise ConflictError(
                f"a server started by qpnserve is already running: pid {running.pid}, since "
                f"{running.started_at:%Y-%m-%d %H:%M:%S} UTC, route "
                f"{'on' if running.route_flag == '1' else 'off'}, {running.base_url}{what}",
                hint="`qpnserve status` shows it, `qpnserve down` stops it, "
                "`qpnserve rollback --restart` restarts it without the route",
            )
        say(f"clearing the record of a server that is gone (pid {running.pid})")
        clear_running(root, running.pid)
    if port_in_use(opts.host, opts.port):
        holder = port_holder(opts.port)
        raise ConflictError(
            f"port {opts.port} on {opts.host} is already in use"
            + (f" by {holder}" if holder else ""),
            hint="stop what listens there, or pass another --port",
        )


def _await_ready(
    popen: subprocess.Popen[bytes],
    running: RunningState,
    root: Path,
    opts: UpOptions,
    say: Progress,
) -> None:
    say(f"waiting up to {opts.timeout_s:.0f} s for the server at {running.base_url}")
    try:
        wait_ready(
            base_url=running.base_url,
            served_model_name=running.served_model_name,
            exit_code=popen.poll,
            log_path=Path(running.log_path),
            timeout_s=opts.timeout_s,
            poll_s=opts.poll_s,
            progress_every_s=opts.progress_every_s,
            progress=say,
        )
    except ServerError as exc:
        if _stop_requested(root, popen.pid):
            raise ServerError(
                "the server was stopped by `qpnserve down` before it was ready"
            ) from None
        if opts.awq_m1:  # a rank that refused a layer says which one, even if the server died
            rejected = _first_rejection(Path(running.report_dir))
            if rejected:
                exc.message = f"{exc.message}\nroute report: {rejected}"
        raise


def _first_rejection(reports_at: Path) -> str | None:
    try:
        reports = read_reports(reports_at)
    except Exception:
        return None
    for report in reports:
        for decision in report.layers:
            if not decision.admitted:
                return f"rank {report.tp_rank} refused {decision.layer}: {decision.reason}"
    return None


def _verify_and_record(
    popen: subprocess.Popen[bytes],
    running: RunningState,
    root: Path,
    opts: UpOptions,
    say: Progress,
) -> RunningState:
    reports = read_reports(Path(running.report_dir))
    expected = expected_moe_layers(opts.model)
    summary = summarize(reports, opts.tp, expected)
    if opts.awq_m1:
        problems = route_problems(
            reports, tp=opts.tp, expected_layers=expected, server_pids=set(group_members(popen.pid))
        )
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ServerError(
                f"the route is not on: {problems[0]}{more}; the server was stopped",
                hint=f"route reports: {running.report_dir}; log: {running.log_path}",
            )
        say(f"route: {summary.text}")
        keys = {r.build_key for r in reports if r.build_key}
        if running.build_key and keys and keys != {running.build_key}:
            say(
                f"warning: the ranks loaded extension build {sorted(keys)}, not {running.build_key}"
            )
    else:
        say(f"route: off ({config.ROUTE_FLAG.name}=0)")
    patch_ids = {r.patch_id for r in reports if r.patch_id}
    with locked(root):
        if _stop_requested(root, popen.pid):
            raise ServerError("the server was stopped by `qpnserve down` while starting")
        ready = running.model_copy(
            update={
                "phase": "ready",
                "ready_at": datetime.now(UTC),
                "patch_id": sorted(patch_ids)[0] if patch_ids else None,
            }
        )
        write_running(root, ready)
    return ready


def _stop_requested(root: Path, pid: int) -> bool:
    try:
        current = read_running(root)
    except Exception:
        return False
    return current is None or current.pid != pid or current.phase == "stopping"


def _serve_foreground(
    popen: subprocess.Popen[bytes], running: RunningState, root: Path, say: Progress
) -> RunningState:
    say(f"ready: serving {running.served_model_name} at {running.base_url}")
    say("Ctrl-C stops the server and every process of its group")
    code = popen.wait()
    with locked(root):
        stopped_by_down = _stop_requested(root, popen.pid)
    if stopped_by_down:
        say("the server was stopped by `qpnserve down`")
        return running
    tail = log_tail(Path(running.log_path), 20)
    raise ServerError(
        f"the server exited with status {code} while serving"
        + ("; last log lines:\n" + "\n".join(f"  | {ln}" for ln in tail) if tail else ""),
        hint=f"full log: {running.log_path}",
    )


def _stop_after_failure(
    popen: subprocess.Popen[bytes],
    running: RunningState,
    root: Path,
    opts: UpOptions,
    say: Progress,
) -> None:
    if group_members(popen.pid):
        say(f"stopping the server (process group {popen.pid})")
    try:
        stop_group(popen.pid, opts.stop_timeout_s, progress=say, reap=popen.poll)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)
        with locked(root):
            clear_running(root, popen.pid)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM to `qpnserve up` (a supervisor's stop) stops the server like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
