"""`qpnserve verify`: the route's numerics acceptance on the user's own checkpoint.

Exit codes: 0 every sample within the contract's bounds; 7 a sample outside them (the worst
layer and sample named); 1 nothing (or not everything) was examined, the checkpoint could not be
read, or (live mode) the host has no route; 2 bad options; 3 no operator build to run; live
mode also 4 and 5 as `up` (a server already running, a server that did not start).
"""

from __future__ import annotations

from pathlib import Path

import typer

from qpnserve import config
from qpnserve.cli.app import app, emit_json, handles_errors, json_failures, message, settings


@app.command()
@handles_errors
def verify(
    ctx: typer.Context,
    model: Path | None = typer.Option(
        None, "--model", "-m", envvar=config.MODEL.name, help="Checkpoint directory."
    ),
    offline: bool = typer.Option(
        False,
        "--offline",
        help="No server: run the operator here (GPU if any, else CPU) on banks prepared from "
        "the checkpoint, with seeded synthetic activations.",
    ),
    layers: str | None = typer.Option(
        None, "--layers", help="MoE layers to verify, e.g. 0,5,40-47 (default: all)."
    ),
    prefixes: str | None = typer.Option(
        None, "--prefixes", help="Which of the three fixed prefixes (0,1,2; default: all)."
    ),
    meta_format: str = typer.Option(
        "both", "--meta-format", help="Bank metadata format: 4byte, 3byte or both."
    ),
    device: str = typer.Option(
        "auto", "--device", help="Offline: auto (a visible GPU, else CPU), cpu or cuda."
    ),
    banks: str = typer.Option(
        "auto",
        "--banks",
        help="Offline: who prepares the banks: auto (the installed host's own converter where "
        "it runs here, else qpnserve, saying why), host (fail if it cannot) or qpnserve.",
    ),
    op: str = typer.Option(
        "auto",
        "--op",
        help="Offline: which M1 op runs: auto (a native host's own op where it runs here, else "
        "qpnserve's operator, saying why), host (fail if it cannot) or qpnserve.",
    ),
    fault: str | None = typer.Option(
        None,
        "--break",
        help="Offline self-test: prepare the last selected layer's banks wrongly on purpose "
        "(gate-up-concat or zero-point-off-by-one); verify must exit 7 naming that layer.",
    ),
    host: str = typer.Option(
        config.DEFAULT_HOST,
        "--host",
        envvar=config.HOST.name,
        help="Live: the address the server binds.",
    ),
    port: int = typer.Option(
        config.DEFAULT_PORT, "--port", envvar=config.PORT.name, help="Live: its port."
    ),
    timeout_s: float = typer.Option(
        config.DEFAULT_UP_TIMEOUT_S,
        "--timeout-s",
        envvar=config.UP_TIMEOUT.name,
        help="Live: readiness deadline.",
    ),
    server_module: str = typer.Option(
        config.DEFAULT_SERVER_MODULE,
        "--server-module",
        envvar=config.SERVER_MODULE.name,
        help="Live: Python module run as the server (tests point it at a stand-in).",
    ),
    quality: bool = typer.Option(
        True,
        "--quality/--no-quality",
        help="Live: also the quality pair (a second start, route off; same prompts, greedy).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Compare the route's output, per MoE layer, TP rank and prefix, with an FP64 reference
    decoded from the checkpoint's own AWQ export; report the largest fraction of the contract's
    rounding bound used (W13, W2) beside the origin's figures, and a verdict."""
    from qpnserve.errors import UsageError

    # the error document keeps "verdict" beside the report's, for scripts that read only it
    with json_failures(as_json, verdict="error"):
        if model is None:
            raise UsageError("missing --model", hint="qpnserve verify --offline --model DIR")
        if offline:
            from qpnserve.host import detect_host  # installed files: the converter loads from them
            from qpnserve.verify.offline import default_plan, run_offline

            plan = default_plan(model, layers, prefixes, meta_format, fault, device, banks, op)
            report = run_offline(
                plan,
                progress=message,
                build_dir=settings(ctx).build_dir,
                host=detect_host(),
                host_env=settings(ctx).environ,
            )
        else:
            offline_only = {"--break": fault, "--meta-format": meta_format != "both"}
            offline_only["--device"] = device != "auto"
            offline_only["--banks"] = banks != "auto"
            offline_only["--op"] = op != "auto"
            given = [name for name, value in offline_only.items() if value]
            if given:
                raise UsageError(f"{', '.join(given)} only apply with --offline")
            from qpnserve.verify.live_run import run_live

            up_fields = {
                "host": host,
                "port": port,
                "timeout_s": timeout_s,
                "server_module": server_module,
            }
            report = run_live(
                model, layers, prefixes, up_fields, message, quality=quality, settings=settings(ctx)
            )
    from qpnserve.verify.report import render_table

    if as_json:
        emit_json(report.to_json())
    else:
        typer.echo(render_table(report))
    if report.verdict != "pass":
        message(f"error: {report.summary()}")
    raise typer.Exit(int(report.exit_code))
