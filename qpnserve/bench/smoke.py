"""`bench smoke`: warm up, measure each concurrency cell, check the canary, build the report.

A run that stops early (server gone, canary fired) still returns its report, marked partial
(complete=False, error set), together with the typed error the CLI turns into an exit code.
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from qpnserve import __version__
from qpnserve.auth import auth_headers
from qpnserve.bench.client import probe_server, request_body, run_wave
from qpnserve.bench.models import (
    BenchReport,
    CanaryResult,
    CellResult,
    ClientInfo,
    PromptInfo,
    Settings,
    StreamRecord,
)
from qpnserve.bench.prompt import Prompt
from qpnserve.bench.steps import StepCounters, StepShare, delta, scrape, share_text
from qpnserve.bench.summarize import canary_failures, summarize_cell
from qpnserve.errors import BenchError, CanaryError, QpnError, ServerError, UsageError

MAX_CONCURRENCY = 256
_MAX_LISTED_CANARY_FAILURES = 20


@dataclass(frozen=True)
class SmokeOptions:
    url: str
    model: str | None  # served model name; None: the first one the server lists
    prompt: Prompt
    prompt_info: PromptInfo
    concurrency: tuple[int, ...] = (1, 4, 8)
    output_tokens: int = 320
    warmup_waves: int = 1
    rounds: int = 1
    request_timeout_s: float = 600.0
    label: str | None = None


@dataclass
class SmokeOutcome:
    report: BenchReport
    failure: QpnError | None  # None: complete run, canary passed


def validate(opts: SmokeOptions) -> None:
    if not opts.concurrency:
        raise UsageError("--concurrency needs at least one value")
    if any(c < 1 or c > MAX_CONCURRENCY for c in opts.concurrency):
        raise UsageError(f"--concurrency values must be 1..{MAX_CONCURRENCY}")
    if len(set(opts.concurrency)) != len(opts.concurrency):
        raise UsageError("--concurrency lists a value twice")
    if opts.output_tokens < 2:
        raise UsageError("--output-tokens must be at least 2 (decode needs two tokens)")
    if opts.warmup_waves < 0 or opts.rounds < 1:
        raise UsageError("--warmup must be >= 0 and --rounds >= 1")
    if opts.request_timeout_s <= 0:
        raise UsageError("--request-timeout-s must be positive")


def parse_concurrency(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(
            f"--concurrency must be a comma-separated list of integers: {text!r}"
        ) from None


def run_smoke(
    opts: SmokeOptions,
    progress: Callable[[str], None] = lambda _: None,
    *,
    api_key: str | None = None,
) -> SmokeOutcome:
    """``api_key``: $VLLM_API_KEY from the settings (None: no key sent)."""
    validate(opts)
    return asyncio.run(_run(opts, progress, api_key))


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _client_info() -> ClientInfo:
    return ClientInfo(
        hostname=platform.node(),
        platform=platform.platform(),
        python=platform.python_version(),
        cpu_count=os.cpu_count(),
    )


def _wave_failure(wave: Sequence[StreamRecord], where: str) -> QpnError | None:
    broken = [(i, r) for i, r in enumerate(wave) if r.error]
    if not broken:
        return None
    index, record = broken[0]
    detail = f"{where}, request {index + 1} of {len(wave)}: {record.error}"
    if record.http_status is not None and 400 <= record.http_status < 500:
        return BenchError(
            f"the server refused the benchmark request ({detail})",
            hint="check --model, --prompt-* and --output-tokens against the server's limits",
        )
    return ServerError(
        f"the server stopped answering during {detail}",
        hint="the report holds what was measured before; read the server log "
        "(`qpnserve status`) before trusting any figure",
    )


async def _run(
    opts: SmokeOptions, progress: Callable[[str], None], api_key: str | None
) -> SmokeOutcome:
    started_at = _now_iso()
    slots = max(opts.concurrency) + 2
    timeout = httpx.Timeout(opts.request_timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
    headers = auth_headers(api_key)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        server = await probe_server(client, opts.url, opts.model)
        _check_fits(opts, server.max_model_len)
        report = BenchReport(
            label=opts.label,
            started_at=started_at,
            qpnserve_version=__version__,
            server=server,
            client=_client_info(),
            settings=Settings(
                concurrency=list(opts.concurrency),
                output_tokens=opts.output_tokens,
                warmup_waves=opts.warmup_waves,
                rounds=opts.rounds,
                request_timeout_s=opts.request_timeout_s,
                prompt=opts.prompt_info,
            ),
            canary=CanaryResult(passed=False, checked_streams=0),
        )
        initial = await scrape(client, opts.url)
        body = request_body(server.model, opts.prompt, opts.output_tokens)
        failure = await _measure(client, opts, body, report, progress)
    _say_speculation(report, initial)
    progress(str(report.server.speculation))
    report.finished_at = _now_iso()
    report.complete = failure is None
    report.error = failure.message if failure else None
    return SmokeOutcome(report=report, failure=failure)


async def _measure(
    client: httpx.AsyncClient,
    opts: SmokeOptions,
    body: dict[str, object],
    report: BenchReport,
    progress: Callable[[str], None],
) -> QpnError | None:
    problems: list[str] = []
    cached_tokens: list[int] = []
    failure: QpnError | None = None
    for concurrency in opts.concurrency:
        scored: list[list[StreamRecord]] = []
        before: StepCounters | str = "the cell scored no wave"
        for index in range(opts.warmup_waves + opts.rounds):
            is_warmup = index < opts.warmup_waves
            if index == opts.warmup_waves:
                # vLLM records a step's counts before it releases the step's tokens, so once
                # the last warm-up stream ended its steps are all in this scrape.
                before = await scrape(client, opts.url)
            number = index + 1 if is_warmup else index - opts.warmup_waves + 1
            where = f"C{concurrency} {'warm-up' if is_warmup else 'wave'} {number}"
            progress(f"{where}: {concurrency} request(s) of {opts.output_tokens} tokens")
            wave = await run_wave(client, opts.url, body, concurrency)
            if not is_warmup:
                scored.append(wave)
                cached_tokens += [r.cached_prompt_tokens for r in wave if r.cached_prompt_tokens]
            for i, record in enumerate(wave):
                problems += canary_failures(record, f"{where}, request {i + 1}")
                report.canary.checked_streams += 0 if record.error else 1
            failure = _wave_failure(wave, where)
            if failure or problems:
                break
        if scored:
            steps = delta(before, await scrape(client, opts.url))
            cell = with_steps(summarize_cell(concurrency, scored), steps)
            report.cells.append(cell)
            if cell.pure_decode_tok_s is not None:
                progress(f"C{concurrency}: pure decode {cell.pure_decode_tok_s:.2f} tok/s")
            progress(f"C{concurrency}: {share_text(steps)}")
        if failure or problems:
            break
    if cached_tokens:
        report.server.cached_prompt_tokens = sum(cached_tokens)
    report.canary.passed = not problems and report.canary.checked_streams > 0
    if report.canary.checked_streams == 0:
        report.canary.note = "no stream was examined (every request broke first): not a pass"
    report.canary.failures = problems[:_MAX_LISTED_CANARY_FAILURES]
    if problems and failure is None:
        failure = CanaryError(
            f"correctness canary failed: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint="the server's output is not sane, so its speed means nothing; roll the route "
            "back (`qpnserve rollback --restart`) and compare",
        )
    return failure


def _say_speculation(report: BenchReport, initial: StepCounters | str) -> None:
    from qpnserve.speculation import from_server, route_meaning, unknown

    if isinstance(initial, str) or initial.missing:
        spec = unknown(initial if isinstance(initial, str) else str(initial.missing))
    else:
        report.server.speculating = initial.draft_tokens is not None
        spec = from_server(report.server.speculating)
    shares = [
        f"{c.single_token_step_share:.2f} at C{c.concurrency}"
        for c in report.cells
        if c.single_token_step_share is not None
    ]
    measured = f"single-token step share {', '.join(shares)}" if shares else None
    report.server.speculation = route_meaning(spec, measured)


def with_steps(cell: CellResult, steps: StepShare) -> CellResult:
    return cell.model_copy(
        update={
            "single_token_step_share": steps.share,
            "single_token_step_reason": steps.reason,
            "engine_steps": steps.engine_steps,
            "single_token_steps": steps.single_token_steps,
            "draft_tokens": steps.draft_tokens,
            "accepted_draft_tokens": steps.accepted_tokens,
            "draft_acceptance_rate": steps.acceptance_rate,
        }
    )


def _check_fits(opts: SmokeOptions, max_model_len: int | None) -> None:
    num_prompt = opts.prompt_info.num_tokens
    if max_model_len is None or num_prompt is None:
        return
    if num_prompt + opts.output_tokens > max_model_len:
        raise BenchError(
            f"prompt ({num_prompt}) + output ({opts.output_tokens}) tokens exceed the server's "
            f"max_model_len {max_model_len}",
            hint="lower --prompt-tokens or --output-tokens",
        )
