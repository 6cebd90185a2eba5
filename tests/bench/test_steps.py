"""The single-token step share from vLLM's /metrics: parsing, deltas, and what smoke, compare
and status make of it. Expected values are literal counts, never the product's own output."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from qpnserve.bench.steps import delta, parse_counters, since_start
from qpnserve.cli import app
from tests.support.fake_server import FakeServerConfig, run_fake_server

runner = CliRunner()

# vLLM's exposition of two engines (data parallel): counts are summed over label sets.
VLLM_METRICS = """\
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 205.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 15.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="m"} 15.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 16.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 16.0
vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 40.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_bucket{engine="1",le="8.0",model_name="m"} 3.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 4.0
vllm:iteration_tokens_total_count{engine="1",model_name="m"} 4.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0
"""

SPEC_METRICS = """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 17.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 8.0
"""


def test_counts_are_summed_over_engines_and_the_le_1_bucket_is_single_token_steps() -> None:
    counters = parse_counters(VLLM_METRICS)
    assert (counters.steps, counters.single_token_steps) == (20.0, 17.0)
    assert (counters.draft_tokens, counters.accepted_tokens) == (None, None)
    share = since_start(counters)
    assert (share.engine_steps, share.single_token_steps, share.share) == (20, 17, 0.85)
    assert share.speculating is False


def test_speculation_counters_give_the_acceptance_rate() -> None:
    share = since_start(parse_counters(VLLM_METRICS + SPEC_METRICS))
    assert (share.draft_tokens, share.accepted_tokens) == (17, 8)
    assert share.acceptance_rate == pytest.approx(8 / 17)


def test_delta_counts_only_the_steps_between_two_scrapes() -> None:
    before = parse_counters(VLLM_METRICS)
    after = parse_counters(
        VLLM_METRICS.replace(
            'le="1.0",model_name="m"} 15.0', 'le="1.0",model_name="m"} 38.0'
        ).replace(
            '_count{engine="0",model_name="m"} 16.0', '_count{engine="0",model_name="m"} 40.0'
        )
    )
    share = delta(before, after)
    assert (share.engine_steps, share.single_token_steps) == (24, 23)
    assert share.share == pytest.approx(23 / 24)


@pytest.mark.parametrize(
    ("text", "reason_start"),
    [
        ("# TYPE x counter\nx_total 1.0\n", "the server exports no vllm:iteration_tokens_total"),
        (
            VLLM_METRICS.replace('le="1.0"', 'le="2.0"'),
            'the server\'s vllm:iteration_tokens_total has no le="1" bucket',
        ),
        ("{{{ not prometheus", "its /metrics is not Prometheus text"),
    ],
)
def test_a_server_without_the_histogram_gives_no_share_and_says_why(
    text: str, reason_start: str
) -> None:
    share = delta(parse_counters(text), parse_counters(text))
    assert share.share is None
    assert share.reason is not None and share.reason.startswith(reason_start)


def test_no_step_between_scrapes_is_no_measurement_not_a_share_of_zero() -> None:
    counters = parse_counters(VLLM_METRICS)
    share = delta(counters, counters)
    assert (share.engine_steps, share.share) == (0, None)
    assert share.reason == "no engine step was counted while the cell ran"


def test_counters_that_go_backwards_are_a_restart_not_a_share() -> None:
    share = delta(parse_counters(VLLM_METRICS), parse_counters(VLLM_METRICS.replace("16.0", "1.0")))
    assert share.share is None and "went backwards" in (share.reason or "")


def test_a_failed_scrape_is_the_reason() -> None:
    share = delta("the server's /metrics answered HTTP 404", parse_counters(VLLM_METRICS))
    assert (share.share, share.reason) == (None, "the server's /metrics answered HTTP 404")


def smoke(url: str, *extra: str) -> dict[str, object]:
    args = ["bench", "smoke", "--url", url, "--output-tokens", "4", "--json"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    report["_stderr"] = result.stderr
    return report  # type: ignore[no-any-return]


def test_smoke_cells_carry_the_share_of_their_scored_requests_only() -> None:
    # Every request adds 24 steps, 23 of them single-token; warm-ups must not be counted.
    config = FakeServerConfig(metrics=True, steps_per_request=24, single_token_steps_per_request=23)
    with run_fake_server(config) as url:
        report = smoke(url, "--concurrency", "1,4", "--warmup", "2")
    cells = {c["concurrency"]: c for c in report["cells"]}  # type: ignore[attr-defined]
    assert (cells[1]["engine_steps"], cells[1]["single_token_steps"]) == (24, 23)
    assert (cells[4]["engine_steps"], cells[4]["single_token_steps"]) == (96, 92)
    for cell in cells.values():
        assert cell["single_token_step_share"] == pytest.approx(23 / 24)
        assert cell["single_token_step_reason"] is None
        assert cell["draft_tokens"] is None and cell["draft_acceptance_rate"] is None
    assert "0.96 (23/24)" in str(report["_stderr"])


def test_smoke_with_speculation_reports_the_draft_acceptance_rate() -> None:
    config = FakeServerConfig(
        metrics=True,
        steps_per_request=8,
        single_token_steps_per_request=2,
        draft_tokens_per_request=20,
        accepted_tokens_per_request=5,
    )
    with run_fake_server(config) as url:
        report = smoke(url, "--concurrency", "2")
    cell = report["cells"][0]  # type: ignore[index]
    assert (cell["engine_steps"], cell["single_token_steps"]) == (16, 4)
    assert (cell["draft_tokens"], cell["accepted_draft_tokens"]) == (40, 10)
    assert cell["draft_acceptance_rate"] == 0.25
    assert "C2: speculating; draft acceptance 0.25 (10 of 40 draft tokens)" in str(
        report["_stderr"]
    )


def test_smoke_against_a_server_without_metrics_says_why_there_is_no_share() -> None:
    with run_fake_server(FakeServerConfig()) as url:
        report = smoke(url, "--concurrency", "1")
    cell = report["cells"][0]  # type: ignore[index]
    assert cell["single_token_step_share"] is None
    assert cell["single_token_step_reason"] == "the server's /metrics answered HTTP 404"
    assert "C1: no 1-token step share: the server's /metrics answered HTTP 404" in str(
        report["_stderr"]
    )


def test_status_reads_the_share_since_the_server_started() -> None:
    from qpnserve.lifecycle.control import _steps

    config = FakeServerConfig(metrics=True, steps_per_request=10, single_token_steps_per_request=9)
    with run_fake_server(config) as url:
        smoke(url, "--concurrency", "1", "--warmup", "1")  # two requests in all
        running = SimpleNamespace(base_url=url, argv=[])
        share, text, speculation = _steps(running, True, 5.0)  # type: ignore[arg-type]
    assert share == pytest.approx(18 / 20)
    assert text == "single-token step share 0.90 (18 of 20 engine steps since the server started)"
    assert speculation is not None and speculation.startswith("speculation off (")
    assert speculation.endswith("; measured single-token step share 0.90")
