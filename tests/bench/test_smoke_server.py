"""`bench smoke` end to end against a real uvicorn process of the stand-in server.

Tolerances: the server schedules tokens on absolute deadlines, so what moves the client's
timestamps is only localhost scheduling jitter (a few ms; tens of ms on a loaded 2-core CI
runner). Gaps (ITL, window length) are therefore checked to +-50 ms and rates to 5 %. TTFT
also holds the client's own cost of sending the request and the server's of parsing it (20-30
ms for the fourth of four requests sent together on an idle 2-core VM, up to ~150 ms with both
cores busy with other work), so it is checked one-sided: never earlier than scheduled (-5 ms
for clock granularity), at most TTFT_OVERHEAD_MS later. Token counts inside the window are
interpolated between arrivals (summarize.py), so jitter moves them by a fraction of a token.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qpnserve.bench.prompt import generated_prompt_ids, load_prompt
from qpnserve.bench.smoke import SmokeOptions, run_smoke
from qpnserve.cli import app
from qpnserve.errors import ExitCode
from tests.support.fake_server import FakeServerConfig, run_fake_server

LATENCY_TOL_MS = 50.0
TTFT_OVERHEAD_MS = 200.0
RATE_TOL = 0.05

runner = CliRunner()


def smoke_options(
    url: str, concurrency: tuple[int, ...], output_tokens: int, warmup_waves: int = 1
) -> SmokeOptions:
    prompt, info = load_prompt(16, None)
    return SmokeOptions(
        url=url,
        model=None,
        prompt=prompt,
        prompt_info=info,
        concurrency=concurrency,
        output_tokens=output_tokens,
        warmup_waves=warmup_waves,
        rounds=1,
        request_timeout_s=30.0,
    )


def assert_ttft(ttft_ms: float | None, scheduled_s: float) -> None:
    assert ttft_ms is not None
    assert scheduled_s * 1e3 - 5.0 <= ttft_ms <= scheduled_s * 1e3 + TTFT_OVERHEAD_MS


def test_smoke_figures_equal_the_servers_controlled_timing() -> None:
    delay_s, step_s, interval_s, num_tokens = 0.25, 0.0625, 0.25, 6
    config = FakeServerConfig(
        first_token_delay_s=delay_s, first_token_step_s=step_s, inter_token_interval_s=interval_s
    )
    with run_fake_server(config) as url:
        outcome = run_smoke(smoke_options(url, (1, 4), num_tokens))
    assert outcome.failure is None and outcome.report.complete
    c1, c4 = outcome.report.cells

    # C1: TTFT = delay; every ITL = interval; window = first..last token; pure = 1 / interval.
    assert_ttft(c1.median_ttft_ms, delay_s)
    assert c1.median_itl_ms == pytest.approx(interval_s * 1e3, abs=LATENCY_TOL_MS)
    assert c1.window_tokens == pytest.approx(num_tokens - 1)
    assert c1.window_s == pytest.approx((num_tokens - 1) * interval_s, abs=LATENCY_TOL_MS / 1e3)
    assert c1.pure_decode_tok_s == pytest.approx(1 / interval_s, rel=RATE_TOL)

    # C4: first tokens at delay + k*step (k = 0..3); window from the last first token to the
    # first finish: (n-1)*interval - 3*step long, holding (n-1) + 3*(n-2) tokens.
    ttfts = sorted(r.ttft_ms or 0.0 for r in c4.per_request)
    for k, ttft_ms in enumerate(ttfts):
        assert_ttft(ttft_ms, delay_s + k * step_s)
    assert c4.median_itl_ms == pytest.approx(interval_s * 1e3, abs=LATENCY_TOL_MS)
    expected_window_s = (num_tokens - 1) * interval_s - 3 * step_s
    assert c4.window_s == pytest.approx(expected_window_s, abs=LATENCY_TOL_MS / 1e3)
    # Tokens are counted between arrivals (summarize.py), so timer jitter makes them fractional.
    assert c4.window_tokens == pytest.approx((num_tokens - 1) + 3 * (num_tokens - 2), abs=0.5)
    assert c4.pure_decode_tok_s == pytest.approx(4 / interval_s, rel=RATE_TOL)
    assert c4.total_output_tokens == 4 * num_tokens
    assert outcome.report.server.version == "fake-test-server"


def test_smoke_sends_the_frozen_prompt_ids_greedy_with_ignore_eos() -> None:
    from qpnserve.bench.client import request_body

    body = request_body("m", generated_prompt_ids(4), 320)
    assert body["prompt"] == generated_prompt_ids(4)
    assert (body["temperature"], body["ignore_eos"], body["max_tokens"]) == (0.0, True, 320)
    assert body["stream"] and body["stream_options"]["include_usage"]


def invoke_smoke(url: str, *extra: str):
    args = ["bench", "smoke", "--url", url, "--output-tokens", "6", "--warmup", "0", "--json"]
    return runner.invoke(app, [*args, *extra])


@pytest.mark.parametrize(
    ("failure", "reason"),
    [("empty", "empty stream"), ("truncated", "ended early"), ("degenerate", "degenerate")],
)
def test_canary_fails_the_run_with_exit_7(failure: str, reason: str) -> None:
    config = FakeServerConfig(failure=failure, failure_after_tokens=3)
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "1,4")
    assert result.exit_code == int(ExitCode.CANARY), result.output
    assert "error: correctness canary failed" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.output
    report = json.loads(result.stdout)
    assert report["canary"]["passed"] is False
    assert [c["concurrency"] for c in report["cells"]] == [1]  # stopped at the first bad cell


def test_canary_also_checks_warmup_streams() -> None:
    config = FakeServerConfig(failure="degenerate")
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "1", "--warmup", "1")
    assert result.exit_code == int(ExitCode.CANARY)
    assert "warm-up 1" in result.stderr


@pytest.mark.parametrize("mode", ["exit", "close"])
def test_server_going_away_mid_run_gives_clear_error_and_partial_report(mode: str) -> None:
    # Request 0 (the C1 wave) is healthy; the C4 wave breaks after 3 tokens.
    config = FakeServerConfig(
        failure=mode, failure_from_request=1, failure_after_tokens=3, inter_token_interval_s=0.01
    )
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "1,4")
    assert result.exit_code == int(ExitCode.SERVER), result.output
    assert "error: the server stopped answering during C4 wave 1" in result.stderr
    assert "Traceback" not in result.output
    assert "PARTIAL REPORT" in result.stderr
    report = json.loads(result.stdout)
    assert report["complete"] is False and "C4 wave 1" in report["error"]
    c1, c4 = report["cells"]
    assert c1["failed"] == 0 and c1["pure_decode_tok_s"] is not None
    assert c4["failed"] >= 1 and c4["pure_decode_tok_s"] is None


def test_partial_report_is_also_written_to_out(tmp_path) -> None:
    config = FakeServerConfig(failure="exit", failure_after_tokens=2)
    out = tmp_path / "run.json"
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "1", "--out", str(out))
    assert result.exit_code == int(ExitCode.SERVER)
    assert json.loads(out.read_text())["complete"] is False


def test_no_server_at_url_is_a_one_line_error(unused_tcp_port: int) -> None:
    result = invoke_smoke(f"http://127.0.0.1:{unused_tcp_port}")
    assert result.exit_code == int(ExitCode.SERVER)
    assert result.stderr.startswith("error: no OpenAI-compatible server answers at")
    # --json: the failure is this run's one document on stdout (#32 defect 4).
    document = json.loads(result.stdout)
    assert document["kind"] == "qpnserve.error"
    assert (document["command"], document["exit_code"]) == ("bench smoke", 5)
    assert document["error"].startswith("no OpenAI-compatible server answers at")


def test_unknown_served_model_name_is_refused_before_measuring() -> None:
    with run_fake_server() as url:
        result = invoke_smoke(url, "--model", "not-served")
    assert result.exit_code == int(ExitCode.FAILED)
    assert "does not serve a model named 'not-served'" in result.stderr


def test_bad_concurrency_is_a_usage_error() -> None:
    result = runner.invoke(app, ["bench", "smoke", "--concurrency", "1,x"])
    assert result.exit_code == int(ExitCode.USAGE)
    assert "comma-separated list of integers" in result.stderr


def test_smoke_table_says_why_a_cell_has_no_pure_figure() -> None:
    # The second request's first token comes 0.5 s after the first request finished.
    config = FakeServerConfig(
        first_token_delay_s=0.05, first_token_step_s=0.5, inter_token_interval_s=0.02
    )
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "2", "--output-tokens", "3")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["cells"][0]["pure_decode_tok_s"] is None
    said = [ln for ln in result.stderr.splitlines() if ln.startswith("C2: no decode window")]
    assert len(said) == 1, result.stderr
    assert "finished at" in said[0]


def test_a_canary_that_examined_no_stream_is_not_a_pass(tmp_path) -> None:
    # Every stream breaks before its end, so the canary sees none (#30 item 5).
    config = FakeServerConfig(failure="close", failure_after_tokens=1)
    with run_fake_server(config) as url:
        result = invoke_smoke(url, "--concurrency", "1", "--warmup", "0")
    assert result.exit_code == int(ExitCode.SERVER), result.output
    canary = json.loads(result.stdout)["canary"]
    assert (canary["passed"], canary["checked_streams"]) == (False, 0)
    assert canary["note"].startswith("no stream was examined")
    assert "canary NOT RUN (0 streams examined): not counted as passed" in result.stderr
    assert "canary passed" not in result.stderr
