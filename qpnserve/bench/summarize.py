"""Pure metrics: stream records in, per-request / per-cell results and canary verdicts out.

No clock, no I/O: the tests feed synthetic timestamps and assert exact values.

Definitions (contract section 6):
- TTFT: first token arrival - request sent.
- ITL: gap between consecutive token-carrying chunks of one stream (pooled over a cell).
- per-request decode tok/s: tokens after the first chunk / (last arrival - first arrival).
- decode window of one wave of C concurrent requests: (max first-token time, min last-token
  time]; only there is every request of the wave decoding, so prefill (before) and the
  draining tail (after) cannot leak into the figure. Pure aggregate decode tok/s = tokens
  inside the window / window length. Each stream's tokens inside are its cumulative token
  count at the end minus at the start, both read off the count interpolated linearly between
  consecutive arrivals: a steady stream with interval d contributes exactly window/d tokens
  whatever its phase, and the other streams' tokens of the decode step that ends the window,
  which arrive a moment after the first finish, are not lost (counting whole arrivals inside
  the window dropped about one token per stream at C > 1).
- output tok/s: every token of the wave / (first send to last finish): what a user sees,
  prefill and tails included.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from qpnserve.bench.models import CellResult, RequestResult, StreamRecord, Window


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between order statistics."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_result(record: StreamRecord, wave: int) -> RequestResult:
    times = record.chunk_times_s
    ttft_ms = (times[0] - record.sent_at_s) * 1e3 if times else None
    itls_ms = [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
    decode_tok_s = None
    if len(times) >= 2 and times[-1] > times[0]:
        decode_tok_s = sum(record.chunk_tokens[1:]) / (times[-1] - times[0])
    return RequestResult(
        wave=wave,
        ttft_ms=ttft_ms,
        tokens_received=record.tokens_received,
        decode_tok_s=decode_tok_s,
        itls_ms=itls_ms,
        finish_reason=record.finish_reason,
        error=record.error,
    )


def wave_window(wave: Sequence[StreamRecord]) -> Window | None:
    """The wave's decode window, or None when it has none (no_window_reason says why)."""
    window = _window_or_reason(wave)
    return window if isinstance(window, Window) else None


def no_window_reason(wave: Sequence[StreamRecord]) -> str | None:
    """Why the wave has no decode window (None when it has one)."""
    window = _window_or_reason(wave)
    return window if isinstance(window, str) else None


def _window_or_reason(wave: Sequence[StreamRecord]) -> Window | str:
    if not wave:
        return "the wave sent no request"
    if any(r.error for r in wave):
        return "a request of the wave failed"
    if any(not r.chunk_times_s for r in wave):
        return "a request of the wave received no token"
    origin_s = min(r.sent_at_s for r in wave)
    start_s = max(r.chunk_times_s[0] for r in wave)
    end_s = min(r.chunk_times_s[-1] for r in wave)
    if end_s <= start_s:
        return (
            f"a request finished at {end_s - origin_s:.2f} s, before the last one's first "
            f"token at {start_s - origin_s:.2f} s, so no moment had every request decoding "
            "(more --output-tokens widens the overlap)"
        )
    tokens = sum(_tokens_by(r, end_s) - _tokens_by(r, start_s) for r in wave)
    return Window(start_s=start_s - origin_s, end_s=end_s - origin_s, tokens=tokens)


def _tokens_by(record: StreamRecord, time_s: float) -> float:
    """The stream's cumulative token count at ``time_s`` (within its first..last arrival),
    interpolated linearly from one arrival to the next."""
    times, counts = record.chunk_times_s, record.chunk_tokens
    cumulative = float(counts[0])
    for k in range(1, len(times)):
        if time_s <= times[k]:
            span_s = times[k] - times[k - 1]
            fraction = (time_s - times[k - 1]) / span_s if span_s > 0 else 1.0
            return cumulative + counts[k] * max(0.0, fraction)
        cumulative += counts[k]
    return cumulative


def _wave_duration_s(wave: Sequence[StreamRecord]) -> float:
    ends = [r.done_at_s or (r.chunk_times_s[-1] if r.chunk_times_s else r.sent_at_s) for r in wave]
    return max(ends) - min(r.sent_at_s for r in wave)


def summarize_cell(concurrency: int, waves: Sequence[Sequence[StreamRecord]]) -> CellResult:
    per_request = [request_result(r, i) for i, wave in enumerate(waves) for r in wave]
    records = [r for wave in waves for r in wave]
    windows = [wave_window(wave) for wave in waves]
    reasons = [
        f"wave {i + 1}: {why}" if len(waves) > 1 else why
        for i, wave in enumerate(waves)
        if (why := no_window_reason(wave))
    ]
    scored = [w for w in windows if w is not None]
    # The pure figure needs every wave's window: a missing one would bias the average.
    complete = bool(waves) and len(scored) == len(windows)
    window_s = sum(w.length_s for w in scored) if complete else None
    window_tokens = sum(w.tokens for w in scored) if complete else None
    duration_s = sum(_wave_duration_s(wave) for wave in waves if wave)
    total_tokens = sum(r.tokens_received for r in records)
    ttfts = [r.ttft_ms for r in per_request if r.ttft_ms is not None]
    itls = [itl for r in per_request for itl in r.itls_ms]
    rates = [r.decode_tok_s for r in per_request if r.decode_tok_s is not None]
    failed = sum(1 for r in records if r.error)
    return CellResult(
        concurrency=concurrency,
        requests=len(records),
        completed=len(records) - failed,
        failed=failed,
        total_output_tokens=total_tokens,
        duration_s=duration_s,
        output_tok_s=total_tokens / duration_s if duration_s > 0 else None,
        window_s=window_s,
        window_tokens=window_tokens,
        pure_decode_tok_s=(window_tokens / window_s)
        if window_s and window_tokens is not None
        else None,
        median_ttft_ms=percentile(ttfts, 50),
        p90_ttft_ms=percentile(ttfts, 90),
        median_itl_ms=percentile(itls, 50),
        p90_itl_ms=percentile(itls, 90),
        mean_decode_tok_s_per_request=sum(rates) / len(rates) if rates else None,
        windows=windows,
        window_note=reasons[0] if reasons else None,
        per_request=per_request,
    )


def canary_failures(record: StreamRecord, where: str) -> list[str]:
    """Why this finished stream is not sane output ([] when it is). Broken streams (record.error)
    are a server failure, not a canary verdict, and are skipped here."""
    if record.error:
        return []
    tokens = record.tokens_received
    if tokens == 0 and not record.chunk_times_s:
        return [f"{where}: empty stream (no token at all)"]
    failures = []
    if tokens < record.max_tokens:
        failures.append(
            f"{where}: stream ended early: {tokens} of {record.max_tokens} tokens "
            f"(finish_reason {record.finish_reason!r}) although ignore_eos was set"
        )
    texts = record.chunk_texts
    if len(texts) >= 2 and len(set(texts)) == 1:
        failures.append(f"{where}: degenerate stream: the same token {texts[0]!r} throughout")
    return failures
