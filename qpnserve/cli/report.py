"""`qpnserve report`: one archive for a bug report (qpnserve.report), its path and a summary."""

from __future__ import annotations

from pathlib import Path

import typer

from qpnserve.cli.app import app, emit_json, handles_errors, settings


@app.command()
@handles_errors
def report(
    ctx: typer.Context,
    out: Path | None = typer.Option(
        None, "--out", help="Archive path (default: qpnserve-report-<UTC time>.tar.gz here)."
    ),
    log_lines: int = typer.Option(200, "--log-lines", help="Last lines of the server log."),
    url: str | None = typer.Option(
        None, "--url", help="Also a server qpnserve did not start (e.g. `vllm serve`)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Gather a bug report into one tar.gz: check --json, host, route values and their sources,
    desired and running state, route reports, the server log's tail (no prompts or completions),
    nvidia-smi topo -m and -q, this Python's packages, qpnserve's version. Tokens, keys and URL
    credentials are redacted; weights are never read."""
    from qpnserve.errors import UsageError
    from qpnserve.report import write_report

    if log_lines < 0:
        raise UsageError(f"--log-lines must be >= 0, got {log_lines}")
    result = write_report(out, log_lines, url, settings=settings(ctx))
    if json_out:
        emit_json(result)
        return
    s = result.summary
    lines = [
        f"report: {result.archive} ({len(result.files)} files, {result.size_bytes / 1024:.0f} KiB)",
        f"  qpnserve {s['qpnserve_version']}; host {s['host']}",
        f"  check:  {s['check']}",
        f"  server: {s['server']}",
        "  redacted: values of "
        + (", ".join(s["redacted_variables"]) or "no variable")
        + "; tokens, keys and URL credentials wherever they appear",
        "  not included: " + ", ".join(s["not_included"]),
        "  files: " + ", ".join(result.files),
    ]
    typer.echo("\n".join(lines))
