"""CLI: `qpnserve bench smoke`, `bench compare`, `bench ab` (the server benchmark).

Tables go to stderr, JSON to stdout (--json) and/or a file (--out). A run that stopped early
still writes its partial report before the error line and the exit code (5 server gone,
7 canary failed). Heavy imports (httpx, pydantic models) stay inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from qpnserve.bench.smoke import SmokeOptions

from qpnserve import config
from qpnserve.cli.app import (
    bench_app,
    emit_json,
    handles_errors,
    json_failures,
    message,
    settings,
)
from qpnserve.config import (
    BENCH_URL,
    HOST,
    MODEL,
    PORT,
    SERVED_MODEL,
    SERVER_MODULE,
    STOP_TIMEOUT,
    TP,
    UP_TIMEOUT,
)

_CONCURRENCY_HELP = "Comma-separated concurrency cells; each is a wave of C requests sent together."
_PROMPT_TOKENS_HELP = "Generate a frozen prompt of N token ids (default 128)."
_PROMPT_FILE_HELP = "Prompt from a file: token ids (JSON list or whitespace/commas) or text."


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def resolve_url(url: str | None, state_dir: Path) -> str:
    """--url / $QPNSERVE_URL, else the server `qpnserve up` recorded, else the vLLM default."""
    if url:
        return normalize_url(url)
    from qpnserve.errors import QpnError
    from qpnserve.state import read_running

    try:
        running = read_running(state_dir) if state_dir.is_dir() else None
    except QpnError:  # a corrupt state file is `status`'s to report, not a reason to stop here
        running = None
    if running is not None:
        message(f"using the server qpnserve started: {running.base_url}")
        return running.base_url
    return config.DEFAULT_URL


def _write_out(path: Path, data: object) -> None:
    from qpnserve.errors import UsageError
    from qpnserve.fsutil import atomic_write_text

    text = data.model_dump_json(indent=2) if hasattr(data, "model_dump_json") else str(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text + "\n", mode=0o644)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _smoke_options(
    url: str,
    model: str | None,
    concurrency: str,
    output_tokens: int,
    prompt_tokens: int | None,
    prompt_file: Path | None,
    warmup: int,
    rounds: int,
    request_timeout_s: float,
    label: str | None = None,
) -> SmokeOptions:
    """The frozen prompt and the smoke settings, the same for `smoke` and both arms of `ab`."""
    from qpnserve.bench.prompt import load_prompt
    from qpnserve.bench.smoke import SmokeOptions, parse_concurrency

    prompt, prompt_info = load_prompt(prompt_tokens, prompt_file)
    return SmokeOptions(
        url=url,
        model=model,
        prompt=prompt,
        prompt_info=prompt_info,
        concurrency=parse_concurrency(concurrency),
        output_tokens=output_tokens,
        warmup_waves=warmup,
        rounds=rounds,
        request_timeout_s=request_timeout_s,
        label=label,
    )


@bench_app.command("smoke")
@handles_errors
def smoke(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None,
        "--url",
        envvar=BENCH_URL.name,
        help="Server base URL (default: the one `qpnserve up` started, "
        f"else {config.DEFAULT_URL}).",
    ),
    model: str | None = typer.Option(
        None, "--model", envvar=SERVED_MODEL.name, help="Served model name (default: the first)."
    ),
    concurrency: str = typer.Option("1,4,8", "--concurrency", help=_CONCURRENCY_HELP),
    output_tokens: int = typer.Option(320, "--output-tokens", help="max_tokens, ignore_eos."),
    prompt_tokens: int | None = typer.Option(None, "--prompt-tokens", help=_PROMPT_TOKENS_HELP),
    prompt_file: Path | None = typer.Option(None, "--prompt-file", help=_PROMPT_FILE_HELP),
    warmup: int = typer.Option(1, "--warmup", help="Unscored warm-up waves per cell."),
    rounds: int = typer.Option(1, "--rounds", help="Scored waves per cell (>=2: noise estimate)."),
    request_timeout_s: float = typer.Option(600.0, "--request-timeout-s"),
    label: str | None = typer.Option(None, "--label", help="A name stored in the report."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON report here."),
) -> None:
    """Stream completions from a running server; report TTFT, ITL and pure decode tok/s."""
    from qpnserve.bench.render import smoke_table
    from qpnserve.bench.smoke import run_smoke

    opts = _smoke_options(
        resolve_url(url, settings(ctx).state_dir),
        model,
        concurrency,
        output_tokens,
        prompt_tokens,
        prompt_file,
        warmup,
        rounds,
        request_timeout_s,
        label,
    )
    from qpnserve.auth import api_key_from_env

    key = api_key_from_env(settings(ctx).environ)
    outcome = run_smoke(opts, progress=message, api_key=key)
    message(smoke_table(outcome.report))
    if as_json:  # the report (partial when the run stopped early) is this run's one document
        emit_json(outcome.report)
    if out is not None:
        _write_out(out, outcome.report)
    if outcome.failure is not None:
        raise outcome.failure


@bench_app.command("compare")
@handles_errors
def compare(
    a: Path = typer.Argument(..., help="Baseline report (e.g. route off)."),
    b: Path = typer.Argument(..., help="Candidate report (e.g. route on)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    out: Path | None = typer.Option(None, "--out", help="Also write the JSON comparison here."),
) -> None:
    """Per-cell deltas in percent of two `bench smoke` reports (B relative to A)."""
    from qpnserve.bench.compare import compare as compare_reports
    from qpnserve.bench.compare import load_report
    from qpnserve.bench.render import compare_table

    result = compare_reports(load_report(a), load_report(b), str(a), str(b))
    message(compare_table(result))
    if as_json:
        emit_json(result)
    if out is not None:
        _write_out(out, result)


@bench_app.command("ab", context_settings={"allow_interspersed_args": False})
@handles_errors
def ab(
    ctx: typer.Context,
    extra_args: list[str] | None = typer.Argument(
        None, metavar="[-- VLLM_ARGS...]", help="Extra server args for both arms."
    ),
    model: Path = typer.Option(..., "--model", envvar=MODEL.name, help="Checkpoint directory."),
    tp: int = typer.Option(config.DEFAULT_TP, "--tp", envvar=TP.name),
    host: str = typer.Option(config.DEFAULT_HOST, "--host", envvar=HOST.name),
    port: int = typer.Option(config.DEFAULT_PORT, "--port", envvar=PORT.name),
    served_model_name: str | None = typer.Option(None, "--served-model-name"),
    concurrency: str = typer.Option("1,4,8", "--concurrency", help=_CONCURRENCY_HELP),
    output_tokens: int = typer.Option(320, "--output-tokens"),
    prompt_tokens: int | None = typer.Option(None, "--prompt-tokens", help=_PROMPT_TOKENS_HELP),
    prompt_file: Path | None = typer.Option(None, "--prompt-file", help=_PROMPT_FILE_HELP),
    warmup: int = typer.Option(1, "--warmup"),
    rounds: int = typer.Option(1, "--rounds"),
    request_timeout_s: float = typer.Option(600.0, "--request-timeout-s"),
    up_timeout_s: float = typer.Option(
        config.DEFAULT_UP_TIMEOUT_S,
        "--up-timeout-s",
        envvar=UP_TIMEOUT.name,
        help="Readiness deadline per start.",
    ),
    stop_timeout_s: float = typer.Option(
        config.DEFAULT_STOP_TIMEOUT_S,
        "--stop-timeout-s",
        envvar=STOP_TIMEOUT.name,
        help="Grace before SIGKILL.",
    ),
    server_module: str | None = typer.Option(
        None,
        "--server-module",
        envvar=SERVER_MODULE.name,
        help="Python module run as the server (default: the host's; tests use a stand-in).",
    ),
    out_dir: Path | None = typer.Option(
        None, "--out-dir", help="Where the two reports and the comparison go (default: state dir)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Route off, smoke; route on, smoke; compare. Leaves the server as it found it."""
    from qpnserve.bench.ab import AbOptions, default_hooks, default_out_dir, run_ab
    from qpnserve.bench.render import compare_table
    from qpnserve.lifecycle import UpOptions

    found = settings(ctx)
    where = out_dir or default_out_dir(found.state_dir)
    with json_failures(as_json, out_dir=str(where)):
        smoke_opts = _smoke_options(
            "",  # the URL is filled per arm from the started server
            None,
            concurrency,
            output_tokens,
            prompt_tokens,
            prompt_file,
            warmup,
            rounds,
            request_timeout_s,
        )
        up_opts = UpOptions(
            model=str(model),
            tp=tp,
            host=host,
            port=port,
            served_model_name=served_model_name,
            detach=True,
            timeout_s=up_timeout_s,
            stop_timeout_s=stop_timeout_s,
            extra_args=list(extra_args or []),
            server_module=server_module,
        )
        opts = AbOptions(up=up_opts, smoke=smoke_opts, out_dir=where)
        result = run_ab(opts, progress=message, hooks=default_hooks(message, found))
    message(compare_table(result.comparison))
    message(f"reports: {result.out_dir}")
    if as_json:
        emit_json(result.comparison)
