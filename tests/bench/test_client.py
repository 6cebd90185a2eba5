"""The client's reading of an SSE completions stream, on canned bytes (no server)."""

from __future__ import annotations

import asyncio
import json

import httpx

from qpnserve.bench.client import _read_events, parse_prefix_caching
from qpnserve.bench.models import StreamRecord


def sse(*events: object) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return "".join(lines).encode()


def chunk(text: str, usage: int | None = None, finish: str | None = None) -> dict:
    usage_obj = None if usage is None else {"prompt_tokens": 4, "completion_tokens": usage}
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish}], "usage": usage_obj}


def read(body: bytes, max_tokens: int = 8) -> StreamRecord:
    record = StreamRecord(sent_at_s=0.0, max_tokens=max_tokens)
    response = httpx.Response(200, stream=httpx.ByteStream(body))
    asyncio.run(_read_events(response, record))
    return record


def test_continuous_usage_counts_multi_token_chunks() -> None:
    final = {
        "choices": [],
        "usage": {"completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}},
    }
    body = sse(chunk(" a", 1), chunk(" b c", 3), chunk(" d e", 5, "length"), final, "[DONE]")
    record = read(body)
    assert record.chunk_tokens == [1, 2, 2]
    assert record.tokens_received == 5 and record.finish_reason == "length"
    assert record.cached_prompt_tokens == 3 and record.error is None


def test_without_usage_each_text_chunk_is_one_token() -> None:
    record = read(sse(chunk(" a"), chunk(""), chunk(" b", finish="length"), "[DONE]"))
    assert record.chunk_tokens == [1, 1] and record.chunk_texts == [" a", " b"]
    assert record.usage_completion_tokens is None and record.tokens_received == 2


def test_stream_without_done_is_an_error() -> None:
    record = read(sse(chunk(" a", 1)))
    assert record.error == "the stream ended without its final [DONE] event"


def test_error_event_in_stream_is_recorded() -> None:
    record = read(sse({"error": {"message": "engine dead"}}))
    assert record.error is not None and "engine dead" in record.error


def test_endless_stream_is_cut_off() -> None:
    body = sse(*[chunk(f" t{i}") for i in range(100)], "[DONE]")
    record = read(body, max_tokens=8)
    assert record.error is not None and "more than 8 tokens" in record.error
    assert len(record.chunk_times_s) == 8 + 64 + 1


def test_prefix_caching_is_read_from_vllm_cache_config_metric() -> None:
    metrics = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="16",enable_prefix_caching="False"} 1.0\n'
    )
    assert parse_prefix_caching(metrics) == "disabled"
    assert parse_prefix_caching(metrics.replace('"False"', '"True"')) == "enabled"
    assert parse_prefix_caching("other_metric 1\n") is None
