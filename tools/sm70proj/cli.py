"""A V100 PROJECTION (not a measurement) of the AWQ M1 op, calibrated on the host's kernels.

    python -m tools.sm70proj [--json] [--latency-us 0.6] [--launch-gap-us G]

No GPU, no nvcc. It reads two kinds of sm_70 machine code with the same tools:
- the host's own M=1 kernels, shipped as sm_70 SASS in the registry's ReVolta 0.1.4 wheel
  (vllm/_C.abi3.so), measured by their authors at 20.62 us (4-byte) / 21.53 us (3-byte) per
  layer in a CUDA-graph probe: the calibration point;
- ours, compiled here for sm_70 (the CI gate's NVRTC 12.8 + ptxas 12.8), and the read floor.
Wheels are fetched by name (pip download --no-deps) into the user cache (tools/sm70proj/
wheels.py); cuobjdump 12.8 comes from the triton 3.3.1 wheel (QPNSERVE_CUOBJDUMP overrides).
The model (tools/sm70proj/model.py) and the kernel tables (tools/sm70proj/tables.py) say
what each term is and where each constant comes from. The last line is the summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from . import builds, model, tables
from .model import NodeTerms

FORMATS = ("3byte", "4byte")


def project_format(fmt: str, workdir: Path, latency: float, gap: float) -> dict[str, object]:
    host = tables.host_kernels(fmt)
    host_bins = builds.host_binaries([k.symbol for k in host], workdir)
    ours = tables.our_kernels(fmt)
    our_bins = builds.our_binaries([k.symbol for k in ours], None, workdir, f"op-{fmt}")
    rows: dict[str, list[NodeTerms]] = {"host": [], "ours": []}
    for side, kernels, bins in (("host", host, host_bins), ("ours", ours, our_bins)):
        for k in kernels:
            b = bins[k.symbol]
            k = dataclasses.replace(k, threads=k.threads or b.threads)
            terms = model.project_node(k, builds.stats(b, k), latency, gap)
            rows[side].append(terms)
    total = sum(k.dram_bytes + k.prefetch_bytes for k in ours)
    floor_bytes = sum(k.dram_bytes for k in ours)
    floor = model.floor_node(floor_bytes, latency, gap)
    design = model.project_single_launch(model.SingleLaunchDesign(), floor_bytes, latency, gap)
    return {
        "format": fmt,
        "host": rows["host"],
        "ours": rows["ours"],
        "floor": floor,
        "single_launch_design": design,
        "ours_dram_bytes": total,
        "host_us": sum(t.total_us for t in rows["host"]),
        "ours_us": sum(t.total_us for t in rows["ours"]),
        "measured_host_us": tables.HOST_MEASURED_US[fmt],
    }


def render_terms(t: NodeTerms) -> str:
    return (
        f"  {t.label:24} gap {t.launch_gap_us:4.2f} + prologue {t.prologue_us:4.2f} + stream "
        f"{t.stream_us:5.2f} ({t.rounds:4.1f} rounds) + bubble {t.bubble_us:4.2f} + issue "
        f"{t.issue_excess_us:4.2f} + epilogue {t.epilogue_us:4.2f} = {t.total_us:5.2f} us  "
        f"[{t.limiter}]"
    )


def render(p: dict[str, object]) -> list[str]:
    fmt, host_us, measured = p["format"], float(p["host_us"]), float(p["measured_host_us"])  # type: ignore[arg-type]
    lines = [f"PROJECTION, {fmt}: V100-PCIe terms per graph node (us)"]
    for key in ("host", "ours"):
        lines.extend(render_terms(t) for t in p[key])  # type: ignore[attr-defined]
    lines.append(render_terms(p["floor"]))  # type: ignore[arg-type]
    lines.append(render_terms(p["single_launch_design"]))  # type: ignore[arg-type]
    lines.append(
        f"  host kernels {host_us:.2f} us projected against {measured:.2f} measured "
        f"({(host_us / measured - 1) * 100:+.0f}%)"
    )
    return lines


def summary(p: dict[str, object]) -> str:
    ours, floor = float(p["ours_us"]), p["floor"].total_us  # type: ignore[arg-type, attr-defined]
    host = float(p["host_us"])  # type: ignore[arg-type]
    measured = float(p["measured_host_us"])  # type: ignore[arg-type]
    tag = "" if p["format"] == "4byte" else " (3-byte)"
    return (
        f"projected V100 us/layer{tag}: op {ours:.1f}, floor {floor:.1f}, host kernel {host:.1f} "
        f"(measured {measured:.1f}), ratio Y/X = {host / ours:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency-us", type=float, default=model.DRAM_LATENCY_US,
                        help="loaded DRAM latency of a V100 [assumption]")  # fmt: skip
    parser.add_argument("--launch-gap-us", type=float, default=None,
                        help="graph node to node on a V100 (default: fitted to the host's "
                        "two measurements)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="keep PTX, cubins and SASS in this folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        gap = args.launch_gap_us
        fitted = gap is None
        if gap is None:  # bodies first (gap 0), then the one per-node cost both probes share
            bodies = [project_format(f, workdir, args.latency_us, 0.0) for f in FORMATS]
            gap = model.fit_launch_gap(
                [float(p["host_us"]) for p in bodies],  # type: ignore[arg-type]
                [tables.HOST_MEASURED_US[f] for f in FORMATS],
                nodes=len(tables.host_kernels("4byte")),
            )
        results = [project_format(f, workdir, args.latency_us, gap) for f in FORMATS]
    low, high = model.LAUNCH_GAP_BOUNDS_US
    how = "fitted to the host's 20.62 / 21.53 us" if fitted else "given"
    inside = "inside" if low <= gap <= high else "OUTSIDE"
    gap_line = (
        f"launch gap per graph node {gap:.2f} us ({how}; {inside} the published V100 range "
        f"{low}-{high} us), loaded DRAM latency {args.latency_us} us"
    )
    if args.json:  # stdout is the JSON alone; the summary goes to stderr
        data = {"launch_gap_us": gap, "launch_gap_fitted": fitted, "formats": results}
        print(json.dumps(data, indent=2, default=lambda o: o.to_json()))
        print("\n".join(summary(p) for p in results), file=sys.stderr)
        return 0
    print(gap_line)
    for p in results:
        print("\n".join(render(p)))
    for p in results:
        print(summary(p))  # the 4-byte line last
    return 0
