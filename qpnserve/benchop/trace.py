"""`bench op --trace`: the V100 design's per-CTA timeline, from its traced copy.

The bench extension's ``awq_moe_m1_traced`` is the shipped kernel plus, in thread 0 of every CTA,
a (%globaltimer ns, %clock64 cycles) stamp at six points (csrc/awq_moe_m1_v100.cuh TraceStamp):
start, W2 issued, strip done, barrier arrived, barrier exited, end. Four scenarios, each over
several layers of banks (so the routed bytes come from DRAM, not L2) and repeats: routed ids or
every id invalid, with the grid barrier or without it (h is then racy; timing only).

What the figures mean and which transfer to a V100 is in docs/operator.md ("The per-CTA
trace"): intervals an SM spends issuing instructions (counted in its cycles) scale by the clock;
DRAM and L2 latencies and the launch do not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

POINTS = ("start", "w2_issued", "strip_done", "arrived", "exited", "end")
SCENARIOS = (
    ("routed", True),
    ("routed", False),
    ("all_invalid", True),
    ("all_invalid", False),
)
RAW_CALLS_KEPT = 1  # per scenario, the raw stamps of this many calls go into the JSON

Stamps = list[list[tuple[int, int]]]  # [cta][point] -> (ns, cycles)


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def call_summary(stamps: Stamps, with_barrier: bool) -> dict[str, float]:
    """The figures of one call, in ns (wall) and SM cycles (per-CTA intervals)."""
    idx = {name: i for i, name in enumerate(POINTS)}

    def ns(cta: list[tuple[int, int]], point: str) -> int:
        return cta[idx[point]][0]

    def cyc(cta: list[tuple[int, int]], a: str, b: str) -> int:
        return cta[idx[b]][1] - cta[idx[a]][1]

    starts = [ns(c, "start") for c in stamps]
    ends = [ns(c, "end") for c in stamps]
    t0 = min(starts)
    out: dict[str, float] = {
        "span_ns": max(ends) - t0,
        "start_spread_ns": max(starts) - t0,
        "end_spread_ns": max(ends) - min(ends),
        "w2_issue_after_start_ns": _median([ns(c, "w2_issued") - ns(c, "start") for c in stamps])
        or 0.0,
        "strip_after_w2_issue_cycles": _median([cyc(c, "w2_issued", "strip_done") for c in stamps])
        or 0.0,
        "w2_issue_to_end_ns": _median([ns(c, "end") - ns(c, "w2_issued") for c in stamps]) or 0.0,
    }
    total_cycles = sum(cyc(c, "start", "end") for c in stamps)
    total_ns = sum(ns(c, "end") - ns(c, "start") for c in stamps)
    out["sm_clock_ghz"] = total_cycles / total_ns if total_ns > 0 else 0.0
    if with_barrier:
        arrivals = [ns(c, "arrived") for c in stamps]
        exits = [ns(c, "exited") for c in stamps]
        out.update(
            {
                "arrival_spread_ns": max(arrivals) - min(arrivals),
                # last arrival -> first exit: the release seen by the first poller
                "release_ns": min(exits) - max(arrivals),
                "exit_spread_ns": max(exits) - min(exits),
                "barrier_wait_median_ns": _median(
                    [ns(c, "exited") - ns(c, "arrived") for c in stamps]
                )
                or 0.0,
                "arrive_cost_cycles": _median([cyc(c, "strip_done", "arrived") for c in stamps])
                or 0.0,
                "after_barrier_ns": _median([ns(c, "end") - ns(c, "exited") for c in stamps])
                or 0.0,
            }
        )
    return out


def summarize(calls: Sequence[Stamps], with_barrier: bool) -> dict[str, float | None]:
    """Median over calls of each call's figures."""
    per_call = [call_summary(c, with_barrier) for c in calls]
    keys = per_call[0].keys() if per_call else ()
    return {k: _median([p[k] for p in per_call]) for k in keys}


def findings(scenarios: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The quantities the V100 model needs, from the four scenarios' medians."""
    routed_b = scenarios["routed/barrier"]["summary"]
    routed_n = scenarios["routed/no_barrier"]["summary"]
    empty_b = scenarios["all_invalid/barrier"]["summary"]
    empty_n = scenarios["all_invalid/no_barrier"]["summary"]

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    return {
        # what the barrier adds to a layer that streams its bytes (0: fully hidden)
        "barrier_exposed_ns": diff(routed_b["span_ns"], routed_n["span_ns"]),
        # what the barrier costs with nothing to hide behind
        "barrier_fixed_ns": diff(empty_b["span_ns"], empty_n["span_ns"]),
        "empty_span_with_barrier_ns": empty_b["span_ns"],
        "empty_span_without_barrier_ns": empty_n["span_ns"],
        "arrival_spread_ns": routed_b.get("arrival_spread_ns"),
        "release_ns": routed_b.get("release_ns"),
        "exit_spread_ns": routed_b.get("exit_spread_ns"),
        "empty_release_ns": empty_b.get("release_ns"),
        "arrive_cost_cycles": routed_b.get("arrive_cost_cycles"),
        "strip_after_w2_issue_cycles": routed_b.get("strip_after_w2_issue_cycles"),
    }


def relative(stamps: Stamps) -> list[list[list[int]]]:
    """A call's stamps as [cta][point] = [ns since the call's first CTA start, cycles since
    this CTA's start] (%clock64 counts per SM, so only a CTA's own differences mean anything)."""
    t0 = min(cta[0][0] for cta in stamps)
    return [[[ns - t0, cyc - cta[0][1]] for ns, cyc in cta] for cta in stamps]


def run_trace(
    traced_call: Callable[[Any, bool], Stamps],
    layers: Sequence[Any],
    empty_layers: Sequence[Any],
    repeats: int,
) -> dict[str, Any]:
    """traced_call(layer, with_barrier) -> stamps of one call. Runs every scenario `repeats`
    times over all layers (the first pass over the layers is a warm-up, not kept)."""
    scenarios: dict[str, dict[str, Any]] = {}
    for ids, with_barrier in SCENARIOS:
        source = layers if ids == "routed" else empty_layers
        for layer in source:
            traced_call(layer, with_barrier)
        calls = [traced_call(layer, with_barrier) for _ in range(repeats) for layer in source]
        name = f"{ids}/{'barrier' if with_barrier else 'no_barrier'}"
        scenarios[name] = {
            "calls": len(calls),
            "summary": summarize(calls, with_barrier),
            "raw_first_calls": [relative(c) for c in calls[:RAW_CALLS_KEPT]],
        }
    return {"points": list(POINTS), "scenarios": scenarios, "findings": findings(scenarios)}
