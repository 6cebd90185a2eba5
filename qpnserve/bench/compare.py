"""`bench compare A B`: per-cell deltas in percent, pure (no I/O but load_report).

Noise: when a run scored several waves per cell (--rounds), the spread of the per-wave pure
decode figures is that run's own noise estimate; a delta inside the larger of the two spreads
is marked as noise. With one wave per cell there is no estimate, and the caveat says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from qpnserve.bench.models import SCHEMA_VERSION, BenchReport, CellResult
from qpnserve.errors import UsageError

Better = Literal["higher", "lower", "neither"]

# (field of CellResult, which direction is better). The single-token step share is not a
# speed: it says how often the route could fire, so it has no better direction.
METRICS: tuple[tuple[str, Better], ...] = (
    ("pure_decode_tok_s", "higher"),
    ("mean_decode_tok_s_per_request", "higher"),
    ("output_tok_s", "higher"),
    ("median_ttft_ms", "lower"),
    ("median_itl_ms", "lower"),
    ("p90_itl_ms", "lower"),
    ("single_token_step_share", "neither"),
)

NOISE_CAVEAT = (
    "Run-to-run noise: two runs of the same server differ too. Treat a delta smaller than the "
    "spread between repeated runs of one arm as no change; measure that spread with --rounds 3 "
    "(or by running the same arm twice) before reading a few percent as an effect."
)


class MetricDelta(BaseModel):
    metric: str
    better: Better
    a: float | None
    b: float | None
    delta_pct: float | None  # (b - a) / a * 100


class CellDelta(BaseModel):
    concurrency: int
    metrics: list[MetricDelta]
    noise_pct: float | None  # the larger per-wave spread of pure decode tok/s, when measured
    pure_delta_within_noise: bool | None
    # Why A's / B's pure decode tok/s is missing (the run's own window note), when it is.
    no_pure_reason_a: str | None = None
    no_pure_reason_b: str | None = None
    no_share_reason_a: str | None = None
    no_share_reason_b: str | None = None


class RunRef(BaseModel):
    path: str
    label: str | None
    started_at: str
    model: str
    server_version: str | None
    complete: bool
    canary_passed: bool


class CompareReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: Literal["qpnserve.bench.compare"] = "qpnserve.bench.compare"
    a: RunRef
    b: RunRef
    comparable: bool
    mismatches: list[str]
    cells: list[CellDelta]
    noise_caveat: str = NOISE_CAVEAT


def load_report(path: Path) -> BenchReport:
    try:
        return BenchReport.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        what = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        raise UsageError(
            f"{path} is not a qpnserve bench report ({what})",
            hint="pass files written by `qpnserve bench smoke --out` or its --json output",
        ) from None


def delta_pct(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a * 100.0


def wave_spread_pct(cell: CellResult) -> float | None:
    """(max - min) / mean of the per-wave pure decode tok/s; None with fewer than two waves."""
    rates = [w.tokens / w.length_s for w in cell.windows if w is not None and w.length_s > 0]
    if len(rates) < 2:
        return None
    mean = sum(rates) / len(rates)
    return (max(rates) - min(rates)) / mean * 100.0 if mean > 0 else None


def mismatches(a: BenchReport, b: BenchReport) -> list[str]:
    found = []
    if a.server.model != b.server.model:
        found.append(f"model differs: {a.server.model!r} vs {b.server.model!r}")
    if a.settings.prompt.sha256 != b.settings.prompt.sha256:
        found.append("the prompts differ (sha256), so prefill and decode context differ")
    if a.settings.output_tokens != b.settings.output_tokens:
        found.append(
            f"output tokens differ: {a.settings.output_tokens} vs {b.settings.output_tokens}"
        )
    if a.server.prefix_caching != b.server.prefix_caching:
        found.append(
            f"prefix caching differs: {a.server.prefix_caching} vs {b.server.prefix_caching}"
        )
    for name, report in (("A", a), ("B", b)):
        if not report.complete:
            found.append(f"{name} is a partial report: {report.error}")
        if report.canary.checked_streams == 0:
            found.append(f"{name}'s canary examined no stream: nothing shows its output is sane")
        elif not report.canary.passed:
            found.append(f"{name} failed the correctness canary: its speed means nothing")
    return found


def _no_pure_reason(cell: CellResult) -> str | None:
    if cell.pure_decode_tok_s is not None:
        return None
    # Reports written before window notes existed carry none: say that much, not nothing.
    return cell.window_note or "the report gives no reason (no decode window in a wave)"


def _no_share_reason(cell: CellResult) -> str | None:
    if cell.single_token_step_share is not None:
        return None
    return cell.single_token_step_reason or "the report predates the 1-token step share"


def _ref(path: str, report: BenchReport) -> RunRef:
    return RunRef(
        path=path,
        label=report.label,
        started_at=report.started_at,
        model=report.server.model,
        server_version=report.server.version,
        complete=report.complete,
        canary_passed=report.canary.passed,
    )


def compare(a: BenchReport, b: BenchReport, a_path: str = "A", b_path: str = "B") -> CompareReport:
    cells_b = {cell.concurrency: cell for cell in b.cells}
    deltas = []
    for cell_a in a.cells:
        cell_b = cells_b.get(cell_a.concurrency)
        if cell_b is None:
            continue
        metrics = []
        for name, better in METRICS:
            value_a, value_b = getattr(cell_a, name), getattr(cell_b, name)
            metrics.append(
                MetricDelta(
                    metric=name,
                    better=better,
                    a=value_a,
                    b=value_b,
                    delta_pct=delta_pct(value_a, value_b),
                )
            )
        spreads = [s for s in (wave_spread_pct(cell_a), wave_spread_pct(cell_b)) if s is not None]
        noise = max(spreads) if spreads else None
        pure = metrics[0].delta_pct
        within = None if noise is None or pure is None else abs(pure) <= noise
        deltas.append(
            CellDelta(
                concurrency=cell_a.concurrency,
                metrics=metrics,
                noise_pct=noise,
                pure_delta_within_noise=within,
                no_pure_reason_a=_no_pure_reason(cell_a),
                no_pure_reason_b=_no_pure_reason(cell_b),
                no_share_reason_a=_no_share_reason(cell_a),
                no_share_reason_b=_no_share_reason(cell_b),
            )
        )
    found = mismatches(a, b)
    only_a = sorted({c.concurrency for c in a.cells} - set(cells_b))
    only_b = sorted(set(cells_b) - {c.concurrency for c in a.cells})
    found += [f"cell C{c} only in A" for c in only_a] + [f"cell C{c} only in B" for c in only_b]
    return CompareReport(
        a=_ref(a_path, a),
        b=_ref(b_path, b),
        comparable=not found,
        mismatches=found,
        cells=deltas,
    )
