"""The effects: talk to the OpenAI-compatible server and record what arrives, and when.

One httpx.AsyncClient, one asyncio task per in-flight request. Each SSE line is timestamped
with perf_counter as soon as httpx hands it over; nothing is summarized here (summarize.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx

from qpnserve.bench.models import ServerInfo, StreamRecord
from qpnserve.bench.prompt import Prompt
from qpnserve.errors import BenchError, ServerError

# A server that keeps streaming past max_tokens is broken; stop reading instead of looping.
_EXTRA_CHUNKS_ALLOWED = 64
_PROBE_TIMEOUT_S = 10.0


def request_body(model: str, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    """Greedy, ignore_eos, exact length, usage in the stream. continuous_usage_stats (vLLM)
    puts the cumulative usage in every chunk, so a chunk carrying two tokens (speculative
    decoding) is counted as two; servers without it send usage once and each chunk counts 1."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


async def stream_one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], max_tokens: int
) -> StreamRecord:
    """Stream one completion. Never raises for transport or HTTP trouble: the record's error
    (and http_status) say what went wrong, so the other requests of the wave finish."""
    record = StreamRecord(sent_at_s=time.perf_counter(), max_tokens=max_tokens)
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.http_status = response.status_code
                record.error = f"HTTP {response.status_code}: {_error_text(text)}"
                return record
            await _read_events(response, record)
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except ValueError as exc:
        record.error = f"malformed stream chunk: {exc}"
    record.done_at_s = time.perf_counter()
    return record


async def _read_events(response: httpx.Response, record: StreamRecord) -> None:
    cumulative_tokens = 0
    saw_done = False
    async for line in response.aiter_lines():
        now_s = time.perf_counter()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            saw_done = True
            break
        chunk = json.loads(data)
        if "error" in chunk and not chunk.get("choices"):
            record.error = f"server error in stream: {_error_text(json.dumps(chunk))}"
            return
        usage = chunk.get("usage")
        choices = chunk.get("choices") or []
        for choice in choices[:1]:
            text = choice.get("text") or ""
            if usage is not None:
                count = int(usage.get("completion_tokens", 0)) - cumulative_tokens
            else:
                count = 1 if text else 0
            if count > 0:
                record.chunk_times_s.append(now_s)
                record.chunk_tokens.append(count)
                record.chunk_texts.append(text)
            record.finish_reason = choice.get("finish_reason") or record.finish_reason
        if usage is not None:
            cumulative_tokens = int(usage.get("completion_tokens", cumulative_tokens))
            record.usage_completion_tokens = cumulative_tokens
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                record.cached_prompt_tokens = int(details["cached_tokens"])
        if len(record.chunk_times_s) > record.max_tokens + _EXTRA_CHUNKS_ALLOWED:
            record.error = f"the server sent more than {record.max_tokens} tokens; stopped reading"
            return
    if not saw_done:
        record.error = "the stream ended without its final [DONE] event"


def _error_text(text: str) -> str:
    try:
        payload = json.loads(text)
        error = payload.get("error", payload)
        message = error.get("message", text) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = text
    return " ".join(str(message).split())[:300]


async def run_wave(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], concurrency: int
) -> list[StreamRecord]:
    """C identical requests sent together; returns when every one of them has ended."""
    max_tokens = int(body["max_tokens"])
    tasks = [stream_one(client, url, body, max_tokens) for _ in range(concurrency)]
    return list(await asyncio.gather(*tasks))


async def probe_server(client: httpx.AsyncClient, url: str, model: str | None) -> ServerInfo:
    """What the server says about itself. No answer on /v1/models means no server."""
    try:
        response = await client.get(url + "/v1/models", timeout=_PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ServerError(
            f"no OpenAI-compatible server answers at {url} ({type(exc).__name__})",
            hint="start one with `qpnserve up`, or point --url / QPNSERVE_URL at it",
        ) from None
    if response.status_code == 401:
        from qpnserve.auth import unauthorized_hint, unauthorized_text

        sent = client.headers.get("Authorization")
        raise ServerError(unauthorized_text(sent, f"{url}/v1/models"), hint=unauthorized_hint())
    if response.status_code != 200:
        raise ServerError(f"{url}/v1/models answered HTTP {response.status_code}")
    served = [m for m in response.json().get("data", []) if isinstance(m, dict)]
    names = [str(m.get("id")) for m in served]
    if model is None:
        if not names:
            raise ServerError(f"{url} serves no model")
        model = names[0]
    elif model not in names:
        raise BenchError(
            f"the server does not serve a model named {model!r} (it serves {names})",
            hint="pass --model with the server's --served-model-name, or leave it out",
        )
    entry = served[names.index(model)]
    max_len = entry.get("max_model_len")
    return ServerInfo(
        url=url,
        model=model,
        version=await _optional_version(client, url),
        max_model_len=int(max_len) if isinstance(max_len, int) else None,
        prefix_caching=await _optional_prefix_caching(client, url),
    )


async def _optional_version(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url + "/version", timeout=_PROBE_TIMEOUT_S)
        if response.status_code == 200:
            return str(response.json().get("version"))
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


def parse_prefix_caching(metrics_text: str) -> str | None:
    """vLLM exports its cache config as labels of the `vllm:cache_config_info` gauge."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            match = re.search(r'enable_prefix_caching="([^"]*)"', line)
            if match:
                value = match.group(1).lower()
                return {"true": "enabled", "false": "disabled"}.get(value, value)
    return None


async def _optional_prefix_caching(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url + "/metrics", timeout=_PROBE_TIMEOUT_S)
        if response.status_code == 200:
            return parse_prefix_caching(response.text)
    except httpx.HTTPError:
        pass
    return None
