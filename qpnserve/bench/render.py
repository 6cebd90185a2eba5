"""Human tables for stderr. Pure: reports in, text out."""

from __future__ import annotations

from qpnserve.bench.compare import CompareReport
from qpnserve.bench.models import BenchReport, CellResult
from qpnserve.bench.steps import acceptance_figure


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(a: float | None, b: float | None) -> str:
    return f"{_num(a)}/{_num(b)}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def smoke_table(report: BenchReport) -> str:
    s = report.settings
    prompt = s.prompt
    prompt_text = f"{prompt.num_tokens} token ids" if prompt.num_tokens else "text"
    lines = [
        f"server  {report.server.url}  model {report.server.model}  "
        f"version {report.server.version or 'unknown'}  "
        f"prefix caching {report.server.prefix_caching or 'not reported'}",
        *([report.server.speculation] if report.server.speculation else []),
        f"prompt  {prompt_text} ({prompt.source}, sha256 {prompt.sha256[:12]})  "
        f"output {s.output_tokens} tokens  greedy, ignore_eos  "
        f"warm-up {s.warmup_waves} wave(s)/cell  scored {s.rounds} wave(s)/cell",
        "",
    ]
    header = [
        "cell", "reqs", "failed", "TTFT p50/p90 ms", "ITL p50/p90 ms",
        "tok/s/req", "pure tok/s", "window s", "out tok/s", "1-token steps",
    ]  # fmt: skip
    rows = [
        [
            f"C{c.concurrency}",
            str(c.requests),
            str(c.failed),
            _pair(c.median_ttft_ms, c.p90_ttft_ms),
            _pair(c.median_itl_ms, c.p90_itl_ms),
            _num(c.mean_decode_tok_s_per_request, 2),
            _num(c.pure_decode_tok_s, 2),
            _num(c.window_s, 2),
            _num(c.output_tok_s, 2),
            _share(c),
        ]
        for c in report.cells
    ]
    lines += _table(header, rows)
    lines.append("")
    lines.append(
        "pure tok/s = tokens inside the window where every request of the cell is decoding "
        "(after the last first token, up to the first finish) / window length"
    )
    lines.append(
        "1-token steps = share of the server's engine steps that processed exactly one token "
        "(one request decoding, no prompt) while the cell's scored requests ran: the only "
        "steps the AWQ M1 route serves"
    )
    lines += [
        f"C{c.concurrency}: no decode window, so no pure tok/s: {c.window_note}"
        for c in report.cells
        if c.pure_decode_tok_s is None and c.window_note
    ]
    lines += [
        f"C{c.concurrency}: no 1-token step share: {c.single_token_step_reason}"
        for c in report.cells
        if c.single_token_step_share is None and c.single_token_step_reason
    ]
    lines += [
        f"C{c.concurrency}: {draft_text(c)}" for c in report.cells if c.draft_tokens is not None
    ]
    canary = report.canary
    if canary.checked_streams == 0:
        lines.append("canary NOT RUN (0 streams examined): not counted as passed")
    else:
        verdict = "passed" if canary.passed else "FAILED"
        lines.append(f"canary {verdict} ({canary.checked_streams} streams checked)")
    lines += [f"  {failure}" for failure in report.canary.failures]
    if not report.complete:
        lines.append(f"PARTIAL REPORT: {report.error}")
    return "\n".join(lines)


def _share(cell: CellResult) -> str:
    if cell.single_token_step_share is None:
        return "-"
    return f"{cell.single_token_step_share:.2f} ({cell.single_token_steps}/{cell.engine_steps})"


def draft_text(cell: CellResult) -> str:
    """Speculation's own figure: how many proposed draft tokens the target model accepted."""
    if cell.draft_acceptance_rate is None:
        return f"speculating; no draft token proposed ({cell.draft_tokens or 0})"
    figure = acceptance_figure(
        cell.draft_acceptance_rate, cell.accepted_draft_tokens, cell.draft_tokens
    )
    return f"speculating; {figure}"


def _delta(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def compare_table(result: CompareReport) -> str:
    a, b = result.a, result.b
    lines = [
        f"A  {a.path}  {a.label or ''}  {a.started_at}  server {a.server_version or 'unknown'}",
        f"B  {b.path}  {b.label or ''}  {b.started_at}  server {b.server_version or 'unknown'}",
        "",
    ]
    header = ["cell", "metric", "A", "B", "delta", "better"]
    rows = []
    for cell in result.cells:
        for m in cell.metrics:
            rows.append(
                [
                    f"C{cell.concurrency}",
                    m.metric,
                    _num(m.a, 2),
                    _num(m.b, 2),
                    _delta(m.delta_pct),
                    m.better,
                ]
            )
        if cell.noise_pct is not None:
            verdict = "within" if cell.pure_delta_within_noise else "outside"
            rows.append(
                [
                    f"C{cell.concurrency}",
                    "wave spread (noise)",
                    "",
                    "",
                    f"±{cell.noise_pct:.1f}%",
                    verdict,
                ]
            )
    lines += _table(header, rows)
    lines.append("")
    for cell in result.cells:
        for name, reason in (("A", cell.no_pure_reason_a), ("B", cell.no_pure_reason_b)):
            if reason:
                lines.append(f"C{cell.concurrency}: no pure tok/s in {name}: {reason}")
        for name, reason in (("A", cell.no_share_reason_a), ("B", cell.no_share_reason_b)):
            if reason:
                lines.append(f"C{cell.concurrency}: no 1-token step share in {name}: {reason}")
    lines += [f"warning: {m}" for m in result.mismatches]
    lines.append(result.noise_caveat)
    return "\n".join(lines)
