"""A real vLLM server with n-gram speculative decoding, started by `qpnserve up`: `up` says
plainly what speculation means for the route, the server counts draft tokens, a lone request's
single-token step share falls below what it is without speculation, and `status` says it too.

vLLM counts a step's tokens as prompt tokens computed plus tokens generated, so with
speculation a step that verified drafts and accepted at least one generated more than one
token. Without speculation a lone request of N tokens is one prefill step and N-1 single-token
steps: a share of exactly (N-1)/N (test_lifecycle_vllm.py measures 23 of 24). The prompt is
one token id repeated: the tiny model's greedy continuation of it repeats short n-grams within
a few tokens, so n-gram drafts are proposed and accepted; greedy decoding makes that the same
on every run (the weights are seeded), not a matter of timing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, ensure_stopped, new_server

pytestmark = pytest.mark.e2e

NGRAM = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
)
OUTPUT_TOKENS = 48
REPEATED_PROMPT = [7] * 64


@pytest.fixture(scope="module")
def spec_server(scratch: Path, tiny_model: Path) -> Iterator[Server]:
    srv = new_server(scratch, tiny_model, "speculation")
    args = [*srv.up_args("--no-awq-m1", "--detach"), "--speculative-config", NGRAM]
    srv.up_result = srv.cli(*args, timeout_s=600)
    yield srv
    ensure_stopped(srv)


def test_up_says_plainly_that_speculation_keeps_the_route_from_firing(spec_server: Server) -> None:
    done = spec_server.up_result
    assert done is not None and done.returncode == 0, done.stderr if done else None
    assert (
        "speculation on (ngram, k=4; --speculative-config in the server's arguments): a decode "
        "step schedules 5 tokens per request, so the M=1 route does not fire on decode; with "
        "full CUDA graphs even a 1-token step replays a 5-row graph"
    ) in done.stderr


def test_speculation_drafts_tokens_and_lowers_the_single_token_step_share(
    spec_server: Server, scratch: Path
) -> None:
    prompt = scratch / "repeated-prompt.json"
    prompt.write_text(json.dumps(REPEATED_PROMPT))
    done = spec_server.cli(
        "bench", "smoke", "--concurrency", "1", "--warmup", "0", "--json",
        "--output-tokens", str(OUTPUT_TOKENS), "--prompt-file", str(prompt),
        timeout_s=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (cell,) = report["cells"]
    assert cell["total_output_tokens"] == OUTPUT_TOKENS
    assert cell["draft_tokens"] > 0  # vllm:spec_decode_num_draft_tokens moved
    assert cell["accepted_draft_tokens"] > 0
    assert cell["draft_acceptance_rate"] == cell["accepted_draft_tokens"] / cell["draft_tokens"]
    without_speculation = (OUTPUT_TOKENS - 1) / OUTPUT_TOKENS
    assert cell["single_token_step_share"] < without_speculation
    assert report["server"]["speculating"] is True
    line = report["server"]["speculation"]
    assert line.startswith("speculation on (its /metrics counts draft tokens): a decode step")
    assert "so the M=1 route does not fire on decode" in line
    assert line in done.stderr
    assert "C1: speculating; draft acceptance " in done.stderr


def test_status_says_speculation_on_with_the_measured_share(spec_server: Server) -> None:
    status = json.loads(spec_server.cli("status", "--json").stdout)
    assert status["speculation_text"].startswith(
        "speculation on (ngram, k=4; its /metrics counts draft tokens): a decode step schedules "
        "5 tokens per request"
    )
    assert "; measured single-token step share " in status["speculation_text"]
    assert "; draft acceptance " in status["steps_text"]
