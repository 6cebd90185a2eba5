"""`qpnserve check`: preflight this machine and (with --model) a checkpoint, before anything loads.

Exit codes: 0 when no check of the groups run FAILed (WARN and SKIP are fine), 1 when one did,
2 for bad options (including an unreadable $QPNSERVE_FACTS_FILE).
"""

from __future__ import annotations

from pathlib import Path

import typer

from qpnserve import config
from qpnserve.cli.app import app, emit_json, handles_errors, message, settings
from qpnserve.errors import ExitCode, UsageError


@app.command()
@handles_errors
def check(
    ctx: typer.Context,
    model: Path | None = typer.Option(
        None,
        "--model",
        "-m",
        envvar=config.MODEL.name,
        help="Checkpoint directory to vet (config.json, index, *.safetensors); headers only.",
    ),
    tp: int = typer.Option(
        config.DEFAULT_TP, "--tp", envvar=config.TP.name, help="Tensor-parallel size."
    ),
    only: str | None = typer.Option(
        None,
        "--only",
        help="Comma-separated groups to run: gpu,toolchain,checkpoint (default: all). "
        "The exit code reflects only these groups.",
    ),
    awq_m1: bool = typer.Option(
        True,
        "--awq-m1/--no-awq-m1",
        help="Check for the AWQ M1 route (default); --no-awq-m1 downgrades route-only "
        "requirements to warnings.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Preflight: GPUs, toolchain and host, and the checkpoint, each check PASS/WARN/FAIL/SKIP
    with a reason and a fix."""
    from qpnserve.preflight import parse_groups, run_preflight
    from qpnserve.preflight.report import render_table

    groups = parse_groups(only)
    if tp < 1:
        raise UsageError(f"--tp must be >= 1, got {tp}")
    if only and "checkpoint" in groups and model is None:
        raise UsageError(
            "--only checkpoint needs --model", hint="qpnserve check --only checkpoint --model DIR"
        )
    report = run_preflight(model, settings=settings(ctx), tp=tp, groups=groups, awq_m1=awq_m1)
    from qpnserve.lifecycle.guards_probe import with_guard_rows

    report = with_guard_rows(report, settings(ctx).environ, tp, model)
    if as_json:
        emit_json(report)
    else:
        typer.echo(render_table(report))
    if not report.ok:
        if not as_json:
            message(f"error: {len(report.failed())} check(s) failed")
        raise typer.Exit(int(ExitCode.FAILED))
