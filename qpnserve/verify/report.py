"""The verify report: one record per sample, the per-layer table, the verdict and its exit code.

A sample is one (layer, prefix, rank, arm, metadata format) comparison of the route's output
with the FP64 reference: W13 = the intermediate h (10 x 160), W2 = out (the rank's 2560 partial
sums). A refused sample examined nothing and never counts as passed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from qpnserve.errors import ExitCode
from qpnserve.verify.bounds import BOUNDS_TEXT, MIN_EQUAL_SHARE

Status = Literal["within", "outside", "refused"]
Verdict = Literal["pass", "outside", "incomplete", "nothing examined"]

# The origin's acceptance (contract section 6): largest fraction of the retained bound used.
ORIGIN_FIGURES = {"route": {"w13": 0.174, "w2": 0.966}, "legacy": {"w13": 0.174, "w2": 0.954}}


@dataclass(frozen=True)
class SampleResult:
    layer: int
    prefix: int
    rank: int
    arm: str  # "route" (qpnserve's operator or the native op) or "legacy" (the host's route)
    meta_format: str  # "4byte" | "3byte"
    status: Status
    w13_fraction: float | None = None  # None when refused; inf for a non-finite output
    w13_equal_share: float | None = None
    w2_fraction: float | None = None
    reason: str = ""

    @property
    def worst_fraction(self) -> float:
        return max(self.w13_fraction or 0.0, self.w2_fraction or 0.0)

    def label(self) -> str:
        return (
            f"layer {self.layer} prefix {self.prefix} rank {self.rank} {self.arm} "
            f"({self.meta_format} metadata)"
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("w13_fraction", "w2_fraction"):
            value = data[key]
            if value is not None and not math.isfinite(value):
                data[key] = None
                data["reason"] = data["reason"] or "non-finite output"
        return data


@dataclass
class VerifyReport:
    mode: Literal["offline", "live"]
    model: str
    operator: str  # which implementation ran the route, in words
    banks: str  # who prepared the banks, in words
    cost: str  # what it said it would cost, before it started
    layers: list[int]
    prefixes: list[int]
    ranks: list[int]
    meta_formats: list[str]
    fault: str | None = None  # a deliberate preparation fault, and the layer it was put in
    fault_layer: int | None = None
    samples: list[SampleResult] = field(default_factory=list)
    quality: Any = None  # live mode: the quality pair (verify.quality.QualityPair), or None
    # Live mode on a native host: {"checked": captured calls, "identical": of those, how many
    # the server served with exactly the route's output}; None elsewhere.
    served: dict[str, int] | None = None

    @property
    def examined(self) -> list[SampleResult]:
        return [s for s in self.samples if s.status != "refused"]

    @property
    def refused(self) -> list[SampleResult]:
        return [s for s in self.samples if s.status == "refused"]

    @property
    def outside(self) -> list[SampleResult]:
        return [s for s in self.samples if s.status == "outside"]

    @property
    def verdict(self) -> Verdict:
        if self.outside:
            return "outside"
        if not self.examined:
            return "nothing examined"
        return "incomplete" if self.refused or self.not_served else "pass"

    @property
    def not_served(self) -> int:
        """Native host, live: captured calls whose served output was not the route's."""
        return self.served["checked"] - self.served["identical"] if self.served else 0

    @property
    def exit_code(self) -> ExitCode:
        return {
            "pass": ExitCode.OK,
            "outside": ExitCode.CANARY,
        }.get(self.verdict, ExitCode.FAILED)

    def worst(self) -> SampleResult | None:
        pool = self.outside or self.examined
        return max(pool, key=lambda s: s.worst_fraction) if pool else None

    def arm_maxima(self) -> dict[str, dict[str, float | None]]:
        """Per arm: the largest W13 and W2 fraction used over the examined samples."""
        out: dict[str, dict[str, float | None]] = {}
        for s in self.examined:
            entry = out.setdefault(s.arm, {"w13": 0.0, "w2": 0.0})
            for key, value in (("w13", s.w13_fraction), ("w2", s.w2_fraction)):
                if value is not None:
                    entry[key] = max(entry[key] or 0.0, value)
        return out

    def summary(self) -> str:
        """The verdict in one line (names the worst layer and sample when outside)."""
        verdict = self.verdict
        if verdict == "outside":
            worst = self.worst()
            assert worst is not None
            return (
                f"OUTSIDE the contract: {len(self.outside)} of {len(self.samples)} samples; "
                f"worst layer {worst.layer}: {worst.label()}, {worst.reason}"
            )
        if verdict == "nothing examined":
            why = self.refused[0].reason if self.refused else "no samples were selected"
            return f"NOT A PASS: nothing was examined ({why})"
        if verdict == "incomplete" and not self.refused:
            assert self.served is not None
            return (
                f"NOT A PASS: the route served {self.served['identical']} of "
                f"{self.served['checked']} captured one-token calls (the server's output differed "
                "from the route's on the others), though every sample is within the bounds"
            )
        if verdict == "incomplete":
            first = self.refused[0]
            return (
                f"NOT A PASS: {len(self.refused)} of {len(self.samples)} samples examined "
                f"nothing (first: {first.label()}: {first.reason})"
            )
        return f"PASS: {len(self.samples)} samples within the contract's bounds"

    def to_json(self) -> dict[str, Any]:
        worst = self.worst()
        return {
            "mode": self.mode,
            "model": self.model,
            "operator": self.operator,
            "banks": self.banks,
            "cost": self.cost,
            "layers": self.layers,
            "prefixes": self.prefixes,
            "ranks": self.ranks,
            "meta_formats": self.meta_formats,
            "fault": self.fault,
            "fault_layer": self.fault_layer,
            "bounds": BOUNDS_TEXT,
            "min_equal_share": MIN_EQUAL_SHARE,
            "origin": ORIGIN_FIGURES,
            "arms": {
                arm: {k: (v if v is not None and math.isfinite(v) else None) for k, v in m.items()}
                for arm, m in self.arm_maxima().items()
            },
            "counts": {
                "samples": len(self.samples),
                "within": len(self.samples) - len(self.outside) - len(self.refused),
                "outside": len(self.outside),
                "refused": len(self.refused),
            },
            "verdict": self.verdict,
            "summary": self.summary(),
            "worst": worst.to_json() if worst else None,
            "exit_code": int(self.exit_code),
            "quality": self.quality.to_json() if self.quality is not None else None,
            "served": self.served,
            "samples": [s.to_json() for s in self.samples],
        }


def served_line(served: dict[str, int]) -> str:
    """Whether the native host's own route served the captured calls."""
    checked, identical = served["checked"], served["identical"]
    line = (
        f"served: the server's own output was the route's, bit for bit, on {identical} of "
        f"{checked} captured one-token calls"
    )
    if identical < checked:
        line += f"; {checked - identical} were served by something else than the route"
    return line


def _fraction(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if math.isfinite(value) else "inf"


def render_table(report: VerifyReport) -> str:
    """Per layer and arm: samples, the largest W13/W2 fractions used, the verdict."""
    head = f"{'layer':>5}  {'arm':<16} {'samples':>7}  {'W13 used':>8}  {'equal':>6}  "
    head += f"{'W2 used':>7}  result"
    lines = [head]
    groups: dict[tuple[int, str], list[SampleResult]] = {}
    for s in report.samples:
        groups.setdefault((s.layer, f"{s.arm} {s.meta_format}"), []).append(s)
    for (layer, arm), rows in groups.items():
        seen = [r for r in rows if r.status != "refused"]
        w13 = max((r.w13_fraction or 0.0 for r in seen), default=None)
        w2 = max((r.w2_fraction or 0.0 for r in seen), default=None)
        equal = min((r.w13_equal_share or 0.0 for r in seen), default=None)
        outside = sum(r.status == "outside" for r in rows)
        refused = sum(r.status == "refused" for r in rows)
        result = "within" if not (outside or refused) else ""
        if outside:
            result = f"OUTSIDE ({outside})"
        if refused:
            result = (result + " " if result else "") + f"REFUSED ({refused}: examined nothing)"
        equal_text = "-" if equal is None else f"{equal:.4f}"
        lines.append(
            f"{layer:>5}  {arm:<16} {len(rows):>7}  {_fraction(w13):>8}  {equal_text:>6}  "
            f"{_fraction(w2):>7}  {result}"
        )
    lines.append("")
    lines.append("fraction of the retained rounding bound used (<= 1 is within the contract):")
    lines.append(f"  W13 (intermediate h): {BOUNDS_TEXT['w13']}")
    lines.append(f"  W2  (out):            {BOUNDS_TEXT['w2']}")
    for arm, maxima in report.arm_maxima().items():
        origin = ORIGIN_FIGURES.get(arm)
        beside = (
            f"   (origin, 1,152 live samples: {origin['w13']} / {origin['w2']})" if origin else ""
        )
        lines.append(
            f"  {arm}: W13 {_fraction(maxima['w13'])} / W2 {_fraction(maxima['w2'])}{beside}"
        )
    lines.append(f"operator: {report.operator}")
    lines.append(f"banks: {report.banks}")
    if report.fault:
        lines.append(f"deliberate fault: {report.fault} in layer {report.fault_layer}")
    if report.quality is not None:
        lines.append(report.quality.line())
    if report.served is not None:
        lines.append(served_line(report.served))
    lines.append(report.summary())
    return "\n".join(lines)
