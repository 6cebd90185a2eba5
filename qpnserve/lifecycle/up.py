"""`up`: start the server safely, prove it serves (and, with the route on, that every rank
admitted every MoE layer), record it, then serve in the foreground or return (detach)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from qpnserve import config
from qpnserve.auth import api_key_from_env
from qpnserve.errors import ServerError
from qpnserve.lifecycle import stages as stage_defaults
from qpnserve.lifecycle.launch import start_server
from qpnserve.lifecycle.options import Progress, UpOptions, stderr_progress
from qpnserve.lifecycle.plan import LaunchPlan, desired_from, plan_launch, starting_state
from qpnserve.lifecycle.prestart import check_conflicts, checks_before_start
from qpnserve.lifecycle.procs import descendants, group_members, log_tail, stop_group
from qpnserve.lifecycle.readiness import wait_ready
from qpnserve.lifecycle.route_check import (
    expected_moe_layers,
    graph_summary,
    route_problems,
    summarize,
)
from qpnserve.lifecycle.stages import Stages
from qpnserve.route_report import clear_reports, read_refusals, read_reports
from qpnserve.speculation import describe_launch
from qpnserve.state import (
    RunningState,
    clear_running,
    locked,
    read_running,
    write_desired,
    write_running,
)

__all__ = ["LaunchPlan", "plan_launch", "up"]


def up(
    opts: UpOptions,
    progress: Progress | None = None,
    stages: Stages | None = None,
    *,
    settings: config.Settings,
) -> RunningState:
    """Start the server; return its state once ready (detach) or once it stopped (foreground).

    Foreground: returns when `qpnserve down` stopped the server; raises ServerError if it exits
    on its own, KeyboardInterrupt (after stopping the group) on Ctrl-C or SIGTERM.
    """
    say = progress or stderr_progress
    stages = stages or stage_defaults.default_stages()  # looked up per call: tests replace it
    plan = plan_launch(opts, settings.state_dir, base_env=settings.environ)
    root, host = checks_before_start(opts, plan.env, say, stages, settings=settings)
    build_key = (
        stages.prepare_extension(host, say, settings)
        if opts.awq_m1 and host.kind == "patched"
        else None
    )
    for line in plan.replaced:
        say(line)
    with locked(root):
        check_conflicts(root, opts, say)
        clear_reports(plan.report_dir)
        key_in_env = api_key_from_env(settings.environ) is not None
        write_desired(root, desired_from(opts, key_in_env))
        popen = start_server(plan.argv, plan.env, plan.cwd, plan.log_path)
        try:
            running = starting_state(
                popen.pid, plan, opts, host.kind, host.version, build_key, host.facts_file
            )
            write_running(root, running)
        except BaseException:
            # Never leave a server that no record names (Ctrl-C or a failed write right here).
            stop_group(popen.pid, 0.0, reap=popen.poll)
            raise
    flag = config.ROUTE_FLAG.name
    say(f"started python -m {opts.module_to_run} (pid {popen.pid}, its own process group)")
    say(f"  {flag}={running.route_flag}  VLLM_PLUGINS={plan.env[config.VLLM_PLUGINS.name]}")
    say(f"  log: {plan.log_path}")
    say(f"  {describe_launch(plan.argv, plan.env)}")
    try:
        with _sigterm_as_interrupt():
            _await_ready(popen, running, root, opts, say, plan.env.get(config.API_KEY.name))
            running = _verify_and_record(popen, running, root, opts, say)
            if opts.detach:
                say(f"ready at {running.base_url} (detached; `qpnserve down` stops it)")
                return running
            return _serve_foreground(popen, running, root, say)
    except BaseException:
        _stop_after_failure(popen, running, root, opts, say)
        raise


def _await_ready(
    popen: subprocess.Popen[bytes],
    running: RunningState,
    root: Path,
    opts: UpOptions,
    say: Progress,
    api_key: str | None,
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
            api_key=api_key,
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
    expected = expected_moe_layers(opts.model_dir)
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
        say(f"graphs: {graph_summary(reports, opts.tp).text}")
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
