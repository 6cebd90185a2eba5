"""A V100 PROJECTION (not a measurement) of the AWQ M1 op, calibrated on the host's kernels.

    python -m tools.sm70proj [--json] [--latency-us 0.6] [--launch-gap-us G] [--write-shipped]

No GPU, no nvcc. It reads two kinds of sm_70 machine code with the same tools:
- the host's own M=1 kernels, shipped as sm_70 SASS in the registry's ReVolta 0.1.4 wheel
  (vllm/_C.abi3.so); their authors measured one layer in a CUDA-graph probe on a V100 at
  20.62 us for the compact 3-byte launch (W13 cooperative reader, W2 scalar) and 21.53 us for
  the scalar 3-byte one: the calibration points. No 4-byte host figure was ever measured;
- ours, compiled here for sm_70 (the CI gate's NVRTC 12.8 + ptxas 12.8), and the read floor.
Wheels are fetched by name (pip download --no-deps) into the user cache (tools/sm70proj/
wheels.py); cuobjdump 12.8 comes from the triton 3.3.1 wheel (QPNSERVE_CUOBJDUMP overrides).
The model (tools/sm70proj/model.py, scoreboard.py) and the kernel tables (tables.py) say what
each term is and where each constant comes from. The last three lines are the summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from . import builds, model, shipped, tables
from .model import Kernel, NodeTerms, SassStats

FORMATS = ("3byte", "4byte")


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """The constants no binary gives (model.py names their sources)."""

    latency_us: float = model.DRAM_LATENCY_US
    spread_us: float = model.HANDOFF_SPREAD_US
    chain_clk: float = model.DEPENDENT_ISSUE_CLK
    # format -> SM cycles of the op's work from W2 issue to the barrier's arrival, measured by a
    # trace (bench op --trace on any GPU: cycles transfer, scaled by the V100's clock)
    window_cycles: tuple[tuple[str, float], ...] = ()


# Their plausible bounds, for the range: loaded DRAM latency 0.4-0.8 us; the barrier's cost beyond
# its L2 trips 0-3 us (unknown on a V100: 1-3 us is plausible, none published); a chained
# instruction 2 cycles (the listings' stall counts average ~2.3) to 4 (Volta's dependent-issue
# latency). The gap is refitted to the host's two probes each time.
RANGE = [
    Assumptions(lat, spread, clk)
    for lat in (0.4, 0.8)
    for spread in (0.0, 3.0)
    for clk in (2.0, 4.0)
]

Loaded = dict[str, list[tuple[Kernel, SassStats]]]


def _read(kernels: list[Kernel], bins: dict[str, builds.Binary]) -> list[tuple[Kernel, SassStats]]:
    out = []
    for k in kernels:
        b = bins[k.symbol]
        k = dataclasses.replace(k, threads=k.threads or b.threads)
        out.append((k, builds.stats(b, k)))
    return out


def load(workdir: Path) -> Loaded:
    """Every kernel's SASS facts, read once: ours per format, the host's per build."""
    loaded: Loaded = {}
    for fmt in FORMATS:
        ours = tables.our_kernels(fmt)
        bins = builds.our_binaries([k.symbol for k in ours], None, workdir, f"op-{fmt}")
        loaded[f"op-{fmt}"] = _read(ours, bins)
    for key, build in tables.HOST_BUILDS.items():
        host = tables.host_kernels(build)
        loaded[f"host-{key}"] = _read(host, builds.host_binaries([k.symbol for k in host], workdir))
    return loaded


def project(loaded: Loaded, a: Assumptions, gap: float) -> dict[str, dict[str, object]]:
    """Ours and the floor per format, the host's launches per build, all at one gap."""
    out: dict[str, dict[str, object]] = {}
    measured = dict(a.window_cycles)
    for key, facts in loaded.items():
        window = measured.get(key[len("op-") :]) if key.startswith("op-") else None
        rows = [
            model.project_node(k, s, a.latency_us, gap, spread_us=a.spread_us,
                               chain_clk=a.chain_clk, window_cycles=window)
            for k, s in facts
        ]  # fmt: skip
        part: dict[str, object] = {"rows": rows, "us": sum(t.total_us for t in rows)}
        if key.startswith("op-"):
            dram = sum(k.dram_bytes for k, _ in facts)
            part["floor"] = model.floor_node(dram, a.latency_us, gap)
        else:
            build = tables.HOST_BUILDS[key[len("host-") :]]
            part.update(label=build.label, measured_us=build.measured_us)
        out[key] = part
    return out


def fitted_gap(loaded: Loaded, a: Assumptions) -> float:
    """Bodies first (gap 0), then the one per-node cost both measured probes share."""
    bodies = project(loaded, a, 0.0)
    measured = {k: b.measured_us for k, b in tables.HOST_BUILDS.items() if b.measured_us}
    return model.fit_launch_gap(
        [float(bodies[f"host-{k}"]["us"]) for k in measured],  # type: ignore[arg-type]
        [float(m) for m in measured.values() if m],
        nodes=2,
    )


def op_range(loaded: Loaded) -> tuple[float, float]:
    """The 3-byte op's projection over the RANGE assumptions (min, max)."""
    ops = [project(loaded, a, fitted_gap(loaded, a))["op-3byte"]["us"] for a in RANGE]
    return min(ops), max(ops)  # type: ignore[type-var, return-value]


def render_terms(t: NodeTerms) -> str:
    return (
        f"  {t.label:24} gap {t.launch_gap_us:4.2f} + prologue {t.prologue_us:4.2f} + stream "
        f"{t.stream_us:5.2f} ({t.rounds:4.1f} rounds) + bubble {t.bubble_us:4.2f} + issue "
        f"{t.issue_excess_us:4.2f} + epilogue {t.epilogue_us:4.2f} = {t.total_us:5.2f} us  "
        f"[{t.limiter}]"
    )


def render(p: dict[str, dict[str, object]]) -> list[str]:
    lines = []
    for key, part in p.items():
        title = part.get("label") or f"the op, {key[3:]}"
        lines.append(f"{key}: {title}")
        lines.extend(render_terms(t) for t in part["rows"])  # type: ignore[attr-defined]
        if "floor" in part:
            lines.append(render_terms(part["floor"]))  # type: ignore[arg-type]
        measured = part.get("measured_us")
        if isinstance(measured, float):
            us = float(part["us"])  # type: ignore[arg-type]
            lines.append(
                f"  projected {us:.2f} us against {measured:.2f} measured "
                f"({(us / measured - 1) * 100:+.0f}%)"
            )
    return lines


def summary(p: dict[str, dict[str, object]]) -> list[str]:
    """The projection's last lines: 4-byte, 20.62/X, then 3-byte (model against model)."""
    figures = shipped.figures(p)
    four, three = figures["4byte"], figures["3byte"]
    return [
        shipped.line(shipped.TAGS["4byte"], four),
        f"20.62/X = {shipped.HOST_MEASURED_3BYTE_US / float(three['op_us'] or 1):.2f}",
        shipped.line(shipped.TAGS["3byte"], three),
    ]


def trace_window_cycles(doc: dict[str, object]) -> tuple[str, float]:
    """(format, SM cycles of the strip's finish after the W2 issue) from a `bench op --trace`
    file. Only intervals the SM spends issuing its own instructions transfer to a V100, scaled
    by its clock (a lower bound there: sm_90's SASS is not sm_70's, and a V100 SM has half the
    FP32 lanes). The arrival (fence + atomic) waits on L2, and the trace's ns figures (release,
    spreads) on DRAM, L2 and the launch: those stay the model's hand-off term."""
    if doc.get("kind") != "qpnserve.op_trace":
        raise ValueError("not a bench op --trace file (kind qpnserve.op_trace)")
    strip = doc["findings"]["strip_after_w2_issue_cycles"]  # type: ignore[index]
    if strip is None:
        raise ValueError("the trace has no strip cycles")
    return str(doc["format"]), float(strip)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency-us", type=float, default=model.DRAM_LATENCY_US,
                        help="loaded DRAM latency of a V100 [assumption]")  # fmt: skip
    parser.add_argument("--launch-gap-us", type=float, default=None,
                        help="graph node to node on a V100 (default: fitted to the host's "
                        "two measurements)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep PTX, cubins and SASS in this folder")
    parser.add_argument("--write-shipped", action="store_true",
                        help=f"write the figures bench op prints to {shipped.SHIPPED}")  # fmt: skip
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        help="a bench op --trace JSON: project with its SM cycles too",
    )
    args = parser.parse_args(argv)
    a = Assumptions(latency_us=args.latency_us)
    try:
        traced = [trace_window_cycles(json.loads(t.read_text())) for t in args.trace]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --trace: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        loaded = load(workdir)
    gap = args.launch_gap_us
    fitted = gap is None
    if gap is None:
        gap = fitted_gap(loaded, a)
    result = project(loaded, a, gap)
    low_us, high_us = op_range(loaded)
    trace_lines = []
    for fmt, cycles in traced:
        with_trace = project(loaded, dataclasses.replace(a, window_cycles=((fmt, cycles),)), gap)
        trace_lines.append(
            f"with the trace's SM cycles, the strip after the W2 issue {cycles:.0f} cycles = "
            f"{model.us(cycles):.2f} us at {model.CLOCK_MHZ:.0f} MHz: {fmt} op "
            f"{float(with_trace[f'op-{fmt}']['us']):.2f} us (without: "  # type: ignore[arg-type]
            f"{float(result[f'op-{fmt}']['us']):.2f} us)"  # type: ignore[arg-type]
        )
    range_line = (
        f"range of the 3-byte op over the assumptions (DRAM latency 0.4-0.8 us, barrier spread "
        f"0-3 us, 2-4 cycles per chained instruction; gap refitted): {low_us:.1f}-{high_us:.1f} us"
    )
    low, high = model.LAUNCH_GAP_BOUNDS_US
    how = "fitted to the host's 20.62 / 21.53 us" if fitted else "given"
    inside = "inside" if low <= gap <= high else "OUTSIDE"
    gap_line = (
        f"launch gap per graph node {gap:.2f} us ({how}; {inside} the published V100 range "
        f"{low}-{high} us), loaded DRAM latency {args.latency_us} us"
    )
    if args.write_shipped:
        doc = shipped.document(result, summary(result), gap, args.latency_us)
        shipped.write({**doc, "op_3byte_range_us": [round(low_us, 1), round(high_us, 1)]})
    if args.json:  # stdout is the JSON alone; the summary goes to stderr
        data = {"launch_gap_us": gap, "launch_gap_fitted": fitted, "projection": result,
                "op_3byte_range_us": [low_us, high_us]}  # fmt: skip
        print(json.dumps(data, indent=2, default=lambda o: o.to_json()))
        print("\n".join(summary(result)), file=sys.stderr)
        return 0
    print(gap_line)
    print("\n".join(render(result)))
    print(range_line)
    print("\n".join([*trace_lines, *summary(result)]))
    return 0
