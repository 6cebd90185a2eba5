"""summarize.py on synthetic timestamps: exact values (dyadic times, so float math is exact)."""

from __future__ import annotations

from qpnserve.bench.models import StreamRecord
from qpnserve.bench.summarize import (
    canary_failures,
    percentile,
    request_result,
    summarize_cell,
    wave_window,
)

T0 = 100.0  # an arbitrary perf_counter origin: only differences matter


def stream(
    first_s: float,
    interval_s: float,
    num_tokens: int,
    *,
    sent_s: float = 0.0,
    texts: list[str] | None = None,
    max_tokens: int | None = None,
) -> StreamRecord:
    times = [T0 + first_s + j * interval_s for j in range(num_tokens)]
    return StreamRecord(
        sent_at_s=T0 + sent_s,
        max_tokens=num_tokens if max_tokens is None else max_tokens,
        chunk_times_s=times,
        chunk_tokens=[1] * num_tokens,
        chunk_texts=texts if texts is not None else [f" t{j}" for j in range(num_tokens)],
        finish_reason="length",
        usage_completion_tokens=num_tokens,
        done_at_s=times[-1] if times else T0 + sent_s,
    )


def staggered_wave(
    concurrency: int, delay_s: float, step_s: float, interval_s: float, num_tokens: int
) -> list[StreamRecord]:
    return [stream(delay_s + k * step_s, interval_s, num_tokens) for k in range(concurrency)]


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 4.6
    assert percentile([7.0], 90) == 7.0
    assert percentile([], 50) is None


def test_request_ttft_itl_and_decode_rate_follow_the_timestamps() -> None:
    result = request_result(stream(0.5, 0.25, 5, sent_s=0.0), wave=0)
    assert result.ttft_ms == 500.0
    assert result.itls_ms == [250.0, 250.0, 250.0, 250.0]
    assert result.decode_tok_s == 4.0  # 4 tokens after the first, over 1.0 s
    assert result.tokens_received == 5


def test_single_stream_window_spans_first_to_last_token() -> None:
    window = wave_window([stream(0.5, 0.25, 9)])
    assert window is not None
    assert (window.start_s, window.end_s, window.tokens) == (0.5, 2.5, 8.0)


def test_staggered_wave_window_excludes_prefill_and_drain() -> None:
    # C=4, first tokens at 0.5 + k/16 s, one token every 0.25 s, 10 tokens each.
    # Window: (0.5 + 3/16, 0.5 + 9 * 0.25] = (0.6875, 2.75], length 2.0625 s.
    # Inside: stream 0 tokens 1..9 (9), streams 1..3 tokens 1..8 (3 * 8): 33 tokens.
    wave = staggered_wave(4, 0.5, 0.0625, 0.25, 10)
    window = wave_window(wave)
    assert window is not None
    assert (window.start_s, window.end_s, window.tokens) == (0.6875, 2.75, 33.0)
    cell = summarize_cell(4, [wave])
    assert cell.window_s == 2.0625
    assert cell.window_tokens == 33.0
    assert cell.pure_decode_tok_s == 16.0  # = C / interval: four streams at 4 tok/s each
    assert cell.median_itl_ms == 250.0
    assert cell.median_ttft_ms == (562.5 + 625.0) / 2
    assert cell.total_output_tokens == 40


def test_cell_pure_rate_pools_windows_of_several_waves() -> None:
    fast = staggered_wave(2, 0.5, 0.125, 0.25, 9)  # window 1.875 s, 8 + 7 = 15 tokens
    slow = staggered_wave(2, 0.5, 0.25, 0.5, 9)  # window 3.75 s, 8 + 7 = 15 tokens
    cell = summarize_cell(2, [fast, slow])
    assert cell.window_s == 1.875 + 3.75
    assert cell.window_tokens == 30.0
    assert cell.pure_decode_tok_s == 30.0 / 5.625
    assert cell.requests == 4 and cell.completed == 4


def test_multi_token_chunks_count_every_token_in_the_window() -> None:
    record = stream(0.5, 0.25, 5)
    record.chunk_tokens = [1, 2, 2, 2, 2]  # speculative decoding: two tokens per chunk
    record.usage_completion_tokens = 9
    window = wave_window([record])
    assert window is not None and window.tokens == 8.0
    assert request_result(record, 0).decode_tok_s == 8.0


def test_no_window_when_one_request_finishes_before_another_starts_decoding() -> None:
    early = stream(0.5, 0.25, 3)  # done at 1.0
    late = stream(1.5, 0.25, 3)  # first token at 1.5
    assert wave_window([early, late]) is None
    assert summarize_cell(2, [[early, late]]).pure_decode_tok_s is None


def test_no_window_and_failed_count_when_a_stream_broke() -> None:
    broken = stream(0.5, 0.25, 3)
    broken.error = "RemoteProtocolError: peer closed connection"
    wave = [stream(0.5, 0.25, 9), broken]
    assert wave_window(wave) is None
    cell = summarize_cell(2, [wave])
    assert (cell.failed, cell.completed, cell.pure_decode_tok_s) == (1, 1, None)


def test_canary_passes_a_full_distinct_stream() -> None:
    assert canary_failures(stream(0.5, 0.25, 8), "C1") == []


def test_canary_fires_on_empty_stream() -> None:
    empty = stream(0.5, 0.25, 0, max_tokens=8)
    empty.finish_reason = "stop"
    assert canary_failures(empty, "C1") == ["C1: empty stream (no token at all)"]


def test_canary_fires_on_truncated_stream() -> None:
    failures = canary_failures(stream(0.5, 0.25, 3, max_tokens=8), "C1")
    assert len(failures) == 1 and "ended early: 3 of 8 tokens" in failures[0]


def test_canary_fires_on_degenerate_stream() -> None:
    failures = canary_failures(stream(0.5, 0.25, 8, texts=["!"] * 8), "C4")
    assert failures == ["C4: degenerate stream: the same token '!' throughout"]


def test_canary_leaves_broken_streams_to_the_server_error() -> None:
    broken = stream(0.5, 0.25, 2, max_tokens=8)
    broken.error = "ReadError"
    assert canary_failures(broken, "C1") == []


def test_lockstep_wave_with_arrival_jitter_loses_no_token_at_the_window_end() -> None:
    # A batched server emits one token per stream per 20 ms step (8 streams, 20 tokens each);
    # over the socket stream j's token of a step arrives j * 0.1 ms later. The first finish
    # (stream 0) ends the window; the other streams' tokens of that same step arrive just
    # after it and must not drop out (they did: 145 counted of 152, 382 tok/s instead of 400).
    step_s, jitter_s = 0.02, 0.0001
    wave = [stream(0.1 + j * jitter_s, step_s, 20) for j in range(8)]
    cell = summarize_cell(8, [wave])
    assert cell.pure_decode_tok_s is not None
    assert abs(cell.pure_decode_tok_s - 8 / step_s) < 1e-6 * (8 / step_s)


def test_cell_without_a_window_says_why() -> None:
    early = stream(0.5, 0.25, 3)  # done at 1.0
    late = stream(1.5, 0.25, 3)  # first token at 1.5
    cell = summarize_cell(2, [[early, late]])
    assert cell.pure_decode_tok_s is None
    assert cell.window_note is not None
    assert "finished at 1.00 s" in cell.window_note
    assert "first token at 1.50 s" in cell.window_note


def test_cell_with_a_window_has_no_note() -> None:
    assert summarize_cell(4, [staggered_wave(4, 0.5, 0.0625, 0.25, 10)]).window_note is None
