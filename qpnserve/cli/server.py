"""CLI commands of the server lifecycle: up, down, status, rollback (stages in qpnserve.lifecycle).

Top-level imports stay typer/stdlib only, so `qpnserve --help` stays fast.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from qpnserve import config
from qpnserve.cli.app import app, emit_json, handles_errors, message, settings

if TYPE_CHECKING:
    from qpnserve.lifecycle import PlanView, StatusReport
    from qpnserve.lifecycle.remote import UrlStatus

_JSON = typer.Option(False, "--json", help="Print one JSON document on stdout.")


@app.command(context_settings={"allow_interspersed_args": False})
@handles_errors
def up(
    ctx: typer.Context,
    extra_args: list[str] | None = typer.Argument(
        None, metavar="[-- VLLM_ARGS...]", help="Extra server args; they override the defaults."
    ),
    awq_m1: bool | None = typer.Option(
        None,
        "--awq-m1/--no-awq-m1",
        help="Route on or off. Default: the desired state (off after `rollback`), else on.",
    ),
    model: Path | None = typer.Option(
        None, "--model", envvar=config.MODEL.name, help="Checkpoint directory (default: desired)."
    ),
    tp: int = typer.Option(
        config.DEFAULT_TP, "--tp", envvar=config.TP.name, help="Tensor-parallel size."
    ),
    host: str = typer.Option(config.DEFAULT_HOST, "--host", envvar=config.HOST.name),
    port: int = typer.Option(config.DEFAULT_PORT, "--port", envvar=config.PORT.name),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="Default: the checkpoint directory's name."
    ),
    detach: bool = typer.Option(False, "--detach", help="Return once ready; the server stays."),
    timeout_s: float = typer.Option(
        config.DEFAULT_UP_TIMEOUT_S,
        "--timeout-s",
        envvar=config.UP_TIMEOUT.name,
        help="Readiness deadline.",
    ),
    stop_timeout_s: float = typer.Option(
        config.DEFAULT_STOP_TIMEOUT_S,
        "--stop-timeout-s",
        envvar=config.STOP_TIMEOUT.name,
        help="Grace before SIGKILL.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Run up's checks (state, conflicts, preflight; not the build), print command and "
        "env, start nothing; exit as up would.",
    ),
    server_module: str = typer.Option(
        config.DEFAULT_SERVER_MODULE,
        "--server-module",
        envvar=config.SERVER_MODULE.name,
        help="Python module run as the server (tests point it at a stand-in).",
    ),
    verify_first: bool = typer.Option(
        False,
        "--verify",
        help="With the route on: run `verify --offline` on every MoE layer first and start only "
        "if it passes; otherwise exit (7: outside the contract) with the route off for the next "
        "start.",
    ),
    json_out: bool = _JSON,
) -> None:
    """Preflight, build or load the extension, start the server, prove it serves (and that every
    rank admitted every MoE layer with the route on), record it. Foreground unless --detach."""
    from qpnserve import lifecycle
    from qpnserve.errors import PreflightError, QpnError

    found = settings(ctx)
    try:
        opts, route_note = lifecycle.resolve_up_options(
            settings=found,
            model=model,
            awq_m1=awq_m1,
            tp=tp,
            host=host,
            port=port,
            served_model_name=served_model_name,
            detach=detach,
            timeout_s=timeout_s,
            stop_timeout_s=stop_timeout_s,
            extra_args=list(extra_args or []),
            server_module=server_module,
        )
        if route_note:
            message(route_note)
        if dry_run:  # its checks' error comes back with the plan, which is its document
            checked = lifecycle.dry_run(opts, progress=message, settings=found)
        else:
            if verify_first:  # before anything starts: a failure leaves no server
                from qpnserve.verify.gate import verify_before_up

                verify_before_up(opts, progress=message, settings=found)
            running = lifecycle.up(opts, progress=message, settings=found)
    except QpnError as exc:  # a report that explains the stop is the document, else the error's
        report = exc.report if isinstance(exc, PreflightError) else None
        verified = getattr(exc, "verify_report", None)  # `--verify` refused: its report
        if json_out and verified is not None:
            emit_json(verified.to_json())
        elif json_out and report is not None:  # what `qpnserve check --json` prints
            emit_json(report)
        raise
    if dry_run:
        _print_plan(checked.view, json_out)
        if checked.error is not None:
            raise checked.error
        return
    if json_out:
        emit_json(running)


def _print_plan(view: PlanView, json_out: bool) -> None:
    from dataclasses import asdict

    from qpnserve.host_profile_preview import preview_lines

    plan = view.plan
    if json_out:
        emit_json(
            {
                "argv": plan.argv,
                "env": plan.recorded_env,
                "cwd": str(plan.cwd),
                "log_path": str(plan.log_path),
                "report_dir": str(plan.report_dir),
                "host": view.host,
                "route": view.route,
                "grouped_route": view.grouped_route,
                "host_profile": asdict(view.host_profile) if view.host_profile else None,
                "facts_file": view.facts_file,
                "speculation": view.speculation,
            }
        )
        return
    message("dry run: nothing was started")
    lines = [f"# environment that decides the route (the rest is inherited), cwd {plan.cwd}"]
    lines.append(f"# host {view.host}: route {view.route}")
    if view.facts_file:
        lines.append(
            f"# host facts from {config.FACTS_FILE.name}={view.facts_file}, not probed from "
            "this machine"
        )
    if view.grouped_route:
        lines.append(f"# {view.grouped_route}")
    if view.host_profile:
        lines += [f"# {line}" for line in preview_lines(view.host_profile)]
    lines.append(f"# {view.speculation}")
    for name, value in plan.recorded_env.items():
        lines.append(f"{name}={shlex.quote(value)}" if value is not None else f"# {name} unset")
    lines.append(shlex.join(plan.argv))
    typer.echo("\n".join(lines))


@app.command()
@handles_errors
def down(
    ctx: typer.Context,
    timeout_s: float = typer.Option(
        config.DEFAULT_STOP_TIMEOUT_S,
        "--timeout-s",
        envvar=config.STOP_TIMEOUT.name,
        help="Grace before SIGKILL.",
    ),
    json_out: bool = _JSON,
) -> None:
    """Stop the recorded server: SIGTERM its process group, wait, SIGKILL what remains, confirm
    no process of the group is left, clear the running state."""
    from qpnserve import lifecycle

    result = lifecycle.down(timeout_s, progress=message, settings=settings(ctx))
    if not result.stopped and result.pid is None:
        message("no server recorded: nothing to stop")
    if json_out:
        emit_json(result)


@app.command()
@handles_errors
def status(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None,
        "--url",
        help="A server qpnserve did not start (e.g. `vllm serve`): what HTTP and /proc say, "
        "and what cannot be known.",
    ),
    json_out: bool = _JSON,
) -> None:
    """Desired versus running state, health, the per-rank route summary, and whether a restart
    is needed (and why)."""
    from qpnserve import lifecycle

    if url:
        from qpnserve.auth import api_key_from_env
        from qpnserve.lifecycle.remote import url_status

        seen = url_status(url, api_key=api_key_from_env(settings(ctx).environ))
        if json_out:
            emit_json(seen)
        else:
            typer.echo(render_url_status(seen))
        return
    report = lifecycle.status(settings=settings(ctx))
    if json_out:
        emit_json(report)
        return
    typer.echo(render_status(report))


def render_status(report: StatusReport) -> str:
    from qpnserve.host_routes import grouped_route_text, route_flag_meaning
    from qpnserve.route_sources import sources_line

    lines = []
    d, r = report.desired, report.running
    if d is None:
        lines.append("desired:  nothing recorded (no `qpnserve up` yet)")
    else:
        plugin = "" if d.include_plugin else ", plugin left out"
        if d.model is None:  # `rollback` before any `up`: only the route was chosen
            what = "no model recorded yet (`qpnserve up --model PATH` records one)"
        else:
            what = f"{d.model}, TP {d.tp}, {d.host}:{d.port}"
        lines.append(f"desired:  route {_on(d.awq_m1)}{plugin}; {what}")
    if r is None:
        lines.append("running:  no server")
    else:
        since = f"{r.started_at:%Y-%m-%d %H:%M:%S} UTC"
        gone = "exited" + (f"; {report.exit_cause}" if report.exit_cause else "")
        state = {"gone": f"GONE ({gone}; record is stale)"}.get(report.server, report.server)
        lines.append(f"running:  {state}, pid {r.pid}, since {since}, {r.base_url}")
        plugin = "in" if r.include_plugin else "out"
        host = f"{r.host_kind} {r.host_version or ''}".rstrip()
        if r.facts_file:
            host += f" (from {config.FACTS_FILE.name}={r.facts_file}, not probed)"
        route = route_flag_meaning(r.route_flag, r.host_kind)
        lines.append(f"          route {route}, plugin {plugin}, host {host}")
        grouped = grouped_route_text(r.env, r.host_kind)
        if grouped:
            lines.append(f"          {grouped}")
        lines.append(
            f"          patch {r.patch_id or '-'}, build {r.build_key or '-'}, "
            f"server python -m {r.server_module}"
        )
        lines.append(f"          log {r.log_path}")
        if report.group_pids:
            lines.append(f"          process group {r.pgid}: {len(report.group_pids)} processes")
        if report.processes:
            named = ", ".join(f"{p.pid} {p.title[:60]}" for p in report.processes)
            lines.append(f"          processes: {named}")
        lines.append(f"health:   {report.health_detail or 'not probed'}")
        lines.append(f"route:    {report.route_text or '-'}")
        if report.route_graphs is not None:
            lines.append(f"graphs:   {report.route_graphs.text}")
        if report.route_values is not None:
            lines.append(f"sources:  {sources_line(report.route_values)}")
        if report.steps_text:
            lines.append(f"steps:    {report.steps_text}")
        if report.speculation_text:
            lines.append(f"          {report.speculation_text}")
    if report.restart_needed:
        lines.append("restart needed: yes")
        lines += [f"  - {reason}" for reason in report.restart_reasons]
        if report.restart_command:
            lines.append(f"  run: {report.restart_command}")
    else:
        lines.append("restart needed: no")
    return "\n".join(lines)


def render_url_status(seen: UrlStatus) -> str:
    lines = [f"server:   {seen.url} (not started by qpnserve)"]
    lines.append(f"health:   {seen.health_detail}")
    models = ", ".join(seen.served_models) or "-"
    lines.append(f"models:   {models}" + (f" (vLLM {seen.version})" if seen.version else ""))
    if seen.processes:
        named = ", ".join(f"{p.pid} {p.title[:60]}" for p in seen.processes)
        lines.append(f"processes: {named}")
    if seen.route_env is not None:
        values = "  ".join(f"{k}={v}" for k, v in seen.route_env.items() if v is not None)
        lines.append(
            f"route env: {values or 'none set'} (source: /proc/{seen.listener_pid}/environ)"
        )
    lines += [f"unknown:  {what}" for what in seen.unknown]
    return "\n".join(lines)


def _on(value: bool) -> str:
    return "on" if value else "off"


@app.command()
@handles_errors
def rollback(
    ctx: typer.Context,
    restart: bool = typer.Option(False, "--restart", help="Then `down` and `up` without it."),
    unpatch: bool = typer.Option(False, "--unpatch", help="Also leave qpnserve's plugin out."),
    timeout_s: float = typer.Option(
        config.DEFAULT_UP_TIMEOUT_S,
        "--timeout-s",
        envvar=config.UP_TIMEOUT.name,
        help="Readiness deadline (restart).",
    ),
    stop_timeout_s: float = typer.Option(
        config.DEFAULT_STOP_TIMEOUT_S,
        "--stop-timeout-s",
        envvar=config.STOP_TIMEOUT.name,
        help="Grace before SIGKILL.",
    ),
    json_out: bool = _JSON,
) -> None:
    """Turn the route off for the next start. A running server keeps it until it restarts (its
    CUDA graphs were captured with it); --restart restarts now, detached."""
    from qpnserve import lifecycle

    result = lifecycle.rollback(
        restart=restart,
        unpatch=unpatch,
        stop_timeout_s=stop_timeout_s,
        up_timeout_s=timeout_s,
        progress=message,
        settings=settings(ctx),
    )
    if json_out:
        emit_json(result)
