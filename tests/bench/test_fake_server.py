"""The stand-in server itself: honest identity, OpenAI stream shape, failure modes."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fake_server import FakeServerConfig, run_fake_server, token_text


def _stream_texts(base_url: str, max_tokens: int) -> tuple[list[str], dict | None]:
    body = {
        "model": "fake-model",
        "prompt": [1, 2, 3],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    texts: list[str] = []
    usage = None
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=10) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            texts += [c["text"] for c in chunk["choices"] if c["text"]]
            usage = chunk["usage"] or usage
    return texts, usage


def test_fake_server_never_claims_to_be_vllm_and_serves_its_model_name() -> None:
    with run_fake_server(FakeServerConfig(model_name="m-under-test")) as base_url:
        assert httpx.get(base_url + "/health").status_code == 200
        assert "vllm" not in httpx.get(base_url + "/version").json()["version"].lower()
        models = httpx.get(base_url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["m-under-test"]


def test_fake_server_streams_distinct_tokens_with_usage_in_last_chunk() -> None:
    with run_fake_server() as base_url:
        texts, usage = _stream_texts(base_url, 5)
    assert texts == [token_text(j) for j in range(5)]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


@pytest.mark.parametrize(
    ("failure", "expected_count", "distinct"),
    [("empty", 0, 0), ("truncated", 2, 2), ("degenerate", 6, 1)],
)
def test_fake_server_failure_modes_shape_the_stream(
    failure: str, expected_count: int, distinct: int
) -> None:
    config = FakeServerConfig(failure=failure, failure_after_tokens=2)
    with run_fake_server(config) as base_url:
        texts, usage = _stream_texts(base_url, 6)
    assert len(texts) == expected_count
    assert len(set(texts)) == distinct
    assert usage is not None and usage["completion_tokens"] == expected_count


def test_fake_server_close_mode_drops_the_connection_mid_body() -> None:
    config = FakeServerConfig(failure="close", failure_after_tokens=2)
    with run_fake_server(config) as base_url, pytest.raises(httpx.RemoteProtocolError):
        _stream_texts(base_url, 6)
