"""`bench compare`: deltas in percent, mismatch warnings, the noise estimate, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.bench.compare import compare, delta_pct
from qpnserve.bench.models import BenchReport, CanaryResult, ClientInfo, ServerInfo, Settings
from qpnserve.bench.prompt import load_prompt
from qpnserve.bench.render import compare_table
from qpnserve.bench.summarize import summarize_cell
from qpnserve.cli import app
from qpnserve.errors import ExitCode
from tests.bench.test_summarize import staggered_wave, stream

runner = CliRunner()


def report(interval_s: float, waves: int = 1, prompt_tokens: int = 16) -> BenchReport:
    _, prompt_info = load_prompt(prompt_tokens, None)
    cells = [
        summarize_cell(c, [staggered_wave(c, 0.5, 0.0625, interval_s, 9) for _ in range(waves)])
        for c in (1, 4)
    ]
    return BenchReport(
        started_at="2026-01-01T00:00:00+00:00",
        qpnserve_version="0",
        server=ServerInfo(url="http://127.0.0.1:8000", model="m"),
        client=ClientInfo(hostname="h", platform="p", python="3", cpu_count=2),
        settings=Settings(
            concurrency=[1, 4],
            output_tokens=9,
            warmup_waves=1,
            rounds=waves,
            request_timeout_s=60,
            prompt=prompt_info,
        ),
        cells=cells,
        canary=CanaryResult(passed=True, checked_streams=10),
        complete=True,
    )


def test_delta_pct_is_relative_to_a() -> None:
    assert delta_pct(50.0, 59.0) == 18.0
    assert delta_pct(None, 1.0) is None and delta_pct(0.0, 1.0) is None


def test_compare_reports_per_cell_deltas() -> None:
    # ITL 0.25 s -> 0.125 s: pure decode doubles (+100 %), median ITL halves (-50 %).
    result = compare(report(0.25), report(0.125))
    assert result.comparable and result.mismatches == []
    assert [c.concurrency for c in result.cells] == [1, 4]
    for cell in result.cells:
        by_name = {m.metric: m for m in cell.metrics}
        assert by_name["pure_decode_tok_s"].delta_pct == 100.0
        assert by_name["median_itl_ms"].delta_pct == -50.0
        assert cell.noise_pct is None  # one wave per cell: no noise estimate
    assert "noise" in result.noise_caveat


def test_compare_flags_different_prompts_and_failed_canary() -> None:
    b = report(0.25, prompt_tokens=17)
    b.canary.passed = False
    result = compare(report(0.25), b)
    assert not result.comparable
    assert any("prompts differ" in m for m in result.mismatches)
    assert any("B failed the correctness canary" in m for m in result.mismatches)


def test_compare_marks_delta_within_wave_spread_as_noise() -> None:
    a = report(0.25, waves=2)
    b = report(0.25, waves=2)
    # Make B's second C1 wave 10 % faster in its window: spread 10 %/mean, delta ~5 %.
    window = b.cells[0].windows[1]
    assert window is not None
    window.tokens *= 1.1
    b.cells[0] = b.cells[0].model_copy(
        update={"pure_decode_tok_s": (8 + 8 * 1.1) / (2 * window.length_s)}
    )
    cell = compare(a, b).cells[0]
    assert cell.noise_pct is not None and 9.0 < cell.noise_pct < 10.0
    assert cell.pure_delta_within_noise is True


def test_cli_compare_prints_table_on_stderr_and_json_on_stdout(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(report(0.25).model_dump_json())
    b.write_text(report(0.125).model_dump_json())
    result = runner.invoke(app, ["bench", "compare", str(a), str(b), "--json"])
    assert result.exit_code == 0, result.output
    assert "pure_decode_tok_s" in result.stderr and "+100.0%" in result.stderr
    assert json.loads(result.stdout)["kind"] == "qpnserve.bench.compare"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"hello": 1}', "(started_at: Field required)"),
        ("garbage", "(Invalid JSON: expected value"),
    ],
)
def test_cli_compare_rejects_a_file_that_is_not_a_report(
    tmp_path: Path, text: str, why: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = runner.invoke(app, ["bench", "compare", str(bad), str(bad)])
    assert result.exit_code == int(ExitCode.USAGE)
    assert result.stderr.startswith(f"error: {bad} is not a qpnserve bench report {why}")
    assert "Traceback" not in result.output


def burst_report() -> BenchReport:
    """C4 as a 2-core vLLM serves it when busy: each request's tokens arrive in one burst, one
    request after another, so no moment has every request decoding (no window)."""
    made = report(0.25)
    bursts = [stream(0.5 + k * 0.25, 0.0, 9) for k in range(4)]
    made.cells[1] = summarize_cell(4, [bursts])
    return made


def test_compare_and_its_table_survive_a_cell_without_a_window() -> None:
    a, b = burst_report(), report(0.25)
    assert a.cells[1].pure_decode_tok_s is None
    result = compare(a, b)
    pure = next(m for m in result.cells[1].metrics if m.metric == "pure_decode_tok_s")
    assert (pure.a, pure.delta_pct) == (None, None)
    assert pure.b == 4 / 0.25
    assert result.cells[1].no_pure_reason_a == a.cells[1].window_note
    assert result.cells[1].no_pure_reason_b is None
    assert result.cells[0].no_pure_reason_a is None


def test_compare_table_says_why_a_pure_figure_is_missing() -> None:
    # The first burst ends at 0.50 s; the last request's first token comes at 1.25 s (#32 defect 5).
    text = compare_table(compare(burst_report(), report(0.25)))
    said = [line for line in text.splitlines() if line.startswith("C4: no pure tok/s")]
    assert said == [
        "C4: no pure tok/s in A: a request finished at 0.50 s, before the last one's first "
        "token at 1.25 s, so no moment had every request decoding (more --output-tokens "
        "widens the overlap)"
    ]


def test_compare_warns_when_a_canary_examined_nothing() -> None:
    empty = report(0.25)
    empty.canary = CanaryResult(passed=False, checked_streams=0)
    result = compare(report(0.25), empty)
    assert "B's canary examined no stream: nothing shows its output is sane" in result.mismatches
    assert result.comparable is False
