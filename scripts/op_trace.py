"""Timeline of one op call on the GPU: where the time goes between kernel A and kernel B.

    python scripts/op_trace.py [--layers 32] [--replays 20] [--paths auto,fused] [--derive]

Builds csrc/ a second time with -DQPN_TRACE (a separate library in --build-dir, never the one
`qpnserve build` makes), so that thread 0 of every CTA writes %globaltimer and %clock64 at up
to 16 points of a call, and its SM (csrc/awq_moe_m1_common.cuh, trace_stamp; the cycle counts
give the SM's clock rate between two points, which tells a slow step from a slow clock). It
replays a CUDA graph of --layers calls like scripts/op_timing.py and reads the last call's
stamps: a call in steady state, whose kernel A waited for the previous call's kernel B (or C).
Times are in ns from the first unit A's start. For tuning runs on a GPU host; not a benchmark
(the stamps cost a few instructions each).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch
from op_timing import DIAG, PATHS, capture_layers, make_banks

from qpnserve.kernels import ops
from qpnserve.kernels import reference as ref
from qpnserve.resources import resource_dir

UNITS_A, STAMPS = 100, 16
SLOTS = 272  # kTraceSlots: units A, then units B (160 of 16 columns, 80 of 32 in other forms)
COLUMNS = 2 * STAMPS + 1  # the stamps, the unit's SM index + 1, the SM's cycle count per stamp
# The stamps each form writes (csrc/awq_moe_m1_common.cuh, trace_stamp), by index, and the
# indices of a unit A's last stamp and of a unit B's "out stored".
POINTS = {
    "two-kernel": (
        (
            "start",
            "ids known",
            "dots done",
            "h stored",
            "(diag) warp 0's dots done",
            "(diag) warp 0's first partial in",
            "",
            "(diag) warp 0 sums done",
            "(diag) SwiGLU done",
            "(diag) after syncwarp",
        ),
        (
            "start",
            "ready to wait",
            "wait over (polled: h in)",
            "out stored",
            "route 0's y summed",
            "every route's y in",
        ),
        3,
        3,
        # the intervals whose SM clock rate is reported (stamp indices, in time order)
        ((1, 4), (4, 5), (5, 7), (7, 3)),
        ((1, 2), (2, 4), (4, 5), (5, 3)),
    ),
    "split": (
        (
            "start",
            "ids known",
            "warp 0's W13 dots done",
            "all dots done, W2 decoded",
            "h stored",
            "h visible to all warps",
            "y shares stored",
            "(diag) warp 0 sums done",
            "(diag) SwiGLU done",
            "(diag) after syncwarp",
            "(diag) warp 0's W13 group 0 in",
            "(diag) warp 0's W13 group 1 in",
            "(diag) warp 0's W13 group 2 in",
            "(diag) warp 0's W13 group 3 in",
            "(diag) warp 0's W13 group 4 in",
            "(diag) warp 0's W2 slice decoded",
        ),
        ("start", "ready to wait", "wait over", "route 0 summed", "out stored"),
        6,
        4,
        ((1, 2), (2, 3), (3, 4)),
        ((2, 3), (3, 4)),
    ),
}


def build_traced(build_dir: Path) -> None:
    from torch.utils import cpp_extension

    csrc = resource_dir("csrc")
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    sources = [str(p) for p in sorted(csrc.iterdir()) if p.suffix in (".cpp", ".cu")]
    flags = ["-O3", "-std=c++17", "-DQPN_TRACE"]
    cpp_extension.load(
        name="qpnserve_ops_trace",
        sources=sources,
        extra_cflags=flags,
        extra_cuda_cflags=flags,
        extra_include_paths=[str(csrc)],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )


def traced_call(
    banks: list[ref.Banks], path: int, replays: int, derive: bool = False
) -> torch.Tensor:
    graph, _tensors = capture_layers(banks, path, derive)
    for _ in range(replays):
        graph.replay()
    stamps = torch.zeros(SLOTS * COLUMNS, dtype=torch.int64, device="cuda")
    torch.ops.qpnserve_trace.read(stamps)
    torch.cuda.synchronize()
    return stamps.view(SLOTS, COLUMNS).cpu()


def spread(values: list[int]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    return f"{min(values):7d} {int(statistics.median(values)):7d} {max(values):7d}"


def clock_rates(
    stamps: list[list[int]], clocks: list[list[int]], pairs: tuple[tuple[int, int], ...]
) -> str:
    """Median SM cycles per ns over the units, for each interval between two stamps."""
    parts = []
    for k0, k1 in pairs:
        rates = [
            (c[k1] - c[k0]) / (t[k1] - t[k0])
            for t, c in zip(stamps, clocks, strict=True)
            if t[k0] and t[k1] and t[k1] > t[k0]
        ]
        parts.append(f"{k0}->{k1} {statistics.median(rates):.2f}" if rates else f"{k0}->{k1} -")
    return ", ".join(parts)


def report(table: torch.Tensor, form: str) -> None:
    """The stamps of one call (the read clears them, so rows a call did not write are zero)."""
    a_points, b_points, a_last, b_end, a_pairs, b_pairs = POINTS[form]
    sms = table[:, STAMPS].tolist()
    clocks = table[:, STAMPS + 1 :].tolist()
    stamps = table[:, :STAMPS]
    units_b = int((stamps[UNITS_A:, 0] != 0).sum())
    t0 = int(stamps[:UNITS_A, 0].min())
    written = (stamps != 0).tolist()  # a point a variant does not stamp stays 0
    a = (stamps[:UNITS_A] - t0).tolist()
    b = (stamps[UNITS_A : UNITS_A + units_b] - t0).tolist()
    print(f"  {'point (ns from the first unit A start)':44} {'min':>7} {'median':>7} {'max':>7}")
    for k, name in enumerate(a_points):
        values = [row[k] for i, row in enumerate(a) if written[i][k]]
        if name:
            print(f"  unit A {name:37} {spread(values)}")
    for k, name in enumerate(b_points):
        values = [row[k] for i, row in enumerate(b) if written[UNITS_A + i][k]]
        if name:
            print(f"  unit B {name:37} {spread(values)}")
    if not any(written[UNITS_A + i][0] for i in range(units_b)):
        print("  (no unit B ran)")
        return
    # Units A on an SM that also runs a unit B against those alone on theirs.
    b_sms = set(sms[UNITS_A : UNITS_A + units_b])
    for shared in (True, False):
        rows = [row for i, row in enumerate(a) if (sms[i] in b_sms) == shared and written[i][0]]
        label = "beside a unit B" if shared else "alone on its SM"
        print(
            f"  unit A {label} ({len(rows)}): dots done {spread([r[2] for r in rows])}, "
            f"h stored {spread([r[a_last] for r in rows])}"
        )
    # SM cycles per ns (GHz): the SM's clock when it ran at full speed, lower if it was slowed.
    raw = stamps.tolist()
    for unit, span, pairs in (
        ("A", slice(0, UNITS_A), a_pairs),
        ("B", slice(UNITS_A, UNITS_A + units_b), b_pairs),
    ):
        rates = clock_rates(raw[span], clocks[span], pairs)
        print(f"  unit {unit} SM clock, GHz, by interval: {rates}")
    a_h = max(row[a_last] for row in a)
    b_wait = [row[2] for row in b]
    print(
        f"  last h stored -> first / last unit B past its wait: "
        f"{min(b_wait) - a_h} / {max(b_wait) - a_h} ns; "
        f"last wait over -> last out stored: {max(row[b_end] for row in b) - max(b_wait)} ns"
    )
    first_h = min(row[a_last] for row in a)
    early = sum(1 for row in b if row[0] < first_h)
    print(f"  unit B CTAs started before the first h was stored: {early} of {units_b}")
    deltas = sorted({int(v) % 1000 for row in a + b for v in row if v > 0})
    print(f"  timer resolution check: {len(deltas)} distinct ns-within-us values")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument(
        "--paths", default="auto,fused", help="comma list of: auto, or a --diag of op_timing.py"
    )
    parser.add_argument("--format", dest="fmt", default="4byte", choices=ref.FORMATS)
    parser.add_argument("--build-dir", type=Path, default=None)
    parser.add_argument(
        "--derive", action="store_true", help="bench op's derive kernel before every layer"
    )
    args = parser.parse_args()
    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="qpnserve-trace-"))
    build_dir.mkdir(parents=True, exist_ok=True)
    build_traced(build_dir)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, traced build")
    banks = make_banks(args.fmt, args.layers)
    for name in args.paths.split(","):
        path = PATHS["mma16816"] | (DIAG[""] if name == "auto" else DIAG[name])
        print(f"{args.fmt} {name}: the last of {args.layers} calls, graph replayed {args.replays}x")
        form = "split" if path & ops.PATH_SPLIT else "two-kernel"  # the split form's bit
        report(traced_call(banks, path, args.replays, args.derive), form)


if __name__ == "__main__":
    main()
