"""`up`: start the server safely, prove it serves (and, with the route on, that every rank
admitted every MoE layer), record it, then serve in the foreground or return (detach)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from qpnserve import config
from qpnserve.errors import ConflictError, PreflightError, ServerError
from qpnserve.lifecycle import stages as stage_defaults
from qpnserve.lifecycle.launch import port_holder, port_in_use, start_server
from qpnserve.lifecycle.options import Progress, UpOptions, stderr_progress, validate
from qpnserve.lifecycle.plan import LaunchPlan, desired_from, plan_launch, starting_state
from qpnserve.lifecycle.procs import (
    descendants,
    gpu_compute_processes,
    group_members,
    is_alive,
    log_tail,
    stop_group,
)
from qpnserve.lifecycle.readiness import wait_ready
from qpnserve.lifecycle.route_check import expected_moe_layers, route_problems, summarize
from qpnserve.lifecycle.stages import HostSummary, Stages
from qpnserve.route_report import clear_reports, read_refusals, read_reports
from qpnserve.state import (
    RunningState,
    clear_running,
    ensure_state_dir,
    locked,
    read_running,
    write_desired,
    write_running,
)

__all__ = ["LaunchPlan", "check_conflicts", "checks_before_start", "plan_launch", "up"]


def up(
    opts: UpOptions, progress: Progress | None = None, stages: Stages | None = None
) -> RunningState:
    """Start the server; return its state once ready (detach) or once it stopped (foreground).

    Foreground: returns when `qpnserve down` stopped the server; raises ServerError if it exits
    on its own, KeyboardInterrupt (after stopping the group) on Ctrl-C or SIGTERM.
    """
    say = progress or stderr_progress
    stages = stages or stage_defaults.default_stages()  # looked up per call: tests replace it
    plan = plan_launch(opts, config.state_dir())
    root, host = checks_before_start(opts, plan.env, say, stages)
    build_key = (
        stages.prepare_extension(host, say) if opts.awq_m1 and host.kind == "patched" else None
    )
    for line in plan.replaced:
        say(line)
    with locked(root):
        check_conflicts(root, opts, say)
        clear_reports(plan.report_dir)
        write_desired(root, desired_from(opts))
        popen = start_server(plan.argv, plan.env, plan.cwd, plan.log_path)
        try:
            running = starting_state(popen.pid, plan, opts, host.kind, host.version, build_key)
            write_running(root, running)
        except BaseException:
            # Never leave a server that no record names (Ctrl-C or a failed write right here).
            stop_group(popen.pid, 0.0, reap=popen.poll)
            raise
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


def checks_before_start(
    opts: UpOptions,
    server_env: Mapping[str, str],
    say: Progress,
    stages: Stages,
    dry_run: bool = False,
) -> tuple[Path, HostSummary]:
    """`up`'s checks before anything starts; the preflight judges ``server_env``."""
    validate(opts)
    root = ensure_state_dir()
    with locked(root):
        check_conflicts(root, opts, say, dry_run)  # fail fast, before the slow stages
    _warn_busy_gpus(say)
    host = stages.preflight(opts, server_env, say)
    if opts.awq_m1 and host.kind not in ("native", "patched"):
        raise PreflightError(
            f"the route needs a native or patchable 1Cat-vLLM host; found: {host.kind}",
            hint="run `qpnserve check --awq-m1` for details",
        )
    return root, host


def _warn_busy_gpus(say: Progress) -> None:
    busy = gpu_compute_processes()
    if not busy:
        return
    held = ", ".join(
        f"GPU {p.gpu_index} pid {p.pid}"
        + (f" ({p.used_mib} MiB)" if p.used_mib is not None else "")
        for p in busy
    )
    say(
        f"warning: the GPUs already hold compute processes: {held}; workers orphaned by an "
        "earlier server keep their memory until killed, and the new server may run out of it"
    )


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
                f"{'on' if running.route_flag == '1' else 'off'}, {running.base_url}{what}",
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
        refusal = _first_refusal(Path(running.report_dir))
        if refusal:  # the plugin stopped the server: its reason, in one line, beats a log tail
            raise ServerError(
                f"the server stopped before it was ready: qpnserve's plugin refused the route "
                f"in {refusal}",
                hint=f"full log: {running.log_path}",
            ) from None
        if opts.awq_m1:  # a rank that refused a layer says which one, even if the server died
            rejected = _first_rejection(Path(running.report_dir))
            if rejected:
                exc.message = f"{exc.message}\nroute report: {rejected}"
        raise


def _first_refusal(reports_at: Path) -> str | None:
    refusals = read_refusals(reports_at)
    if not refusals:
        return None
    first = refusals[0]
    return f"{first.process} (pid {first.pid}): {first.reason}"


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
        server_pids = set(group_members(popen.pid)) | {s.pid for s in descendants(popen.pid)}
        problems = route_problems(
            reports, tp=opts.tp, expected_layers=expected, server_pids=server_pids
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
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    # Even status 0 is a failure here: nobody asked it to stop (vLLM exits 0 after an engine
    # death, vllm#48966). Its TP workers may outlive it; the caller stops the whole group.
    raise ServerError(
        f"the server {how} while serving"
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
