"""Kernel-tuning timer: the op alone, per layer, in a CUDA graph over layers of E=512 banks.

    python scripts/op_timing.py [--layers 32] [--iters 200] [--rounds 3] [--paths auto,mma884]
                                [--derive]

Each layer has its own 512-expert banks (393 MB at 4-byte metadata) and its own random route.
The same routes are replayed, so the routed bytes of one replay (7.68 MB per layer) must be
several times the L2 for every replay to read them from HBM: at 8 layers (61 MB against the
H200's 60 MiB) the op measured 0.8 us per layer faster than at 32, part of it from L2.
The graph runs the op once per layer back to back, or with --derive `qpnserve bench op`'s
derive kernel before each (the benchmark's graph shape). `qpnserve bench op` is the reported
benchmark; this is the quick A/B for tuning. Needs a CUDA build loaded (QPNSERVE_BUILD_DIR as
for `qpnserve build`).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from qpnserve.kernels import build, ops
from qpnserve.kernels import reference as ref

PATHS = {"auto": ops.PATH_AUTO, "mma16816": ops.PATH_MMA16816, "mma884": ops.PATH_MMA884}
# Diagnostic bits of the path argument (csrc/awq_moe_m1_cuda.cu): split the time. They apply to
# the form the path takes: on sm_90 "auto" is the two-kernel form with the polled hand-off
# ("B-only" runs the waiting kernel B alone), "two-kernels" pins kernel B waiting for kernel A's
# completion, "split" and "fused" the other forms; the split form's own variants carry 4096.
DIAG = {
    "": 0,
    "A-only": 4,
    "B-only": 8,
    "no-pdl": 16,
    "launch-only": 32,
    "A8warps": 1 << 6,
    "A10warps": 2 << 6,
    "A20warps": 3 << 6,
    "two-kernels": 256,
    "two-kernels-no-pdl": 256 | 16,
    "two-kernels-no-prefetch": 256 | 1024,
    # the two-kernel form, kernel A not prefetching W2 and kernel B holding its W2 loads back
    # 250 ns x k (sm_90 with PDL): W13 served first, h published while W2 still streams
    **{f"staged-{250 * k}": 256 | 1024 | (k << 18) for k in range(1, 8)},
    # kernel A prefetches W2 into L2 once its W13 has landed, kernel B loads it after its wait
    "late-w2": 256 | (1 << 21),
    # kernel B polls h as kernel A publishes it (tagged words) instead of waiting for A's
    # completion; A does not prefetch W2
    "polled": 1 << 22,
    "polled-no-end-wait": (1 << 22) | (1 << 23),  # kernel B does not wait for A at its end
    # the polled form's units in one launch of 180 CTAs (one grid instead of two)
    "fused-polled": 1 << 26,
    # the polled form with kernel B of 32-column tiles (80 CTAs; 160 of 16 columns by default)
    "polled-b32": 1 << 27,
    # the 16-column kernel B dequantizing W2 after its poll (not while kernel A streams), with its
    # MMAs in one accumulator
    "polled-b16-late": 1 << 28,
    # the 16-column kernel B's MMAs in one accumulator (two by default: chains of 3 and 2 groups)
    "polled-b16-1acc": 1 << 29,
    "polled-b16-5acc": 1 << 30,  # five accumulators, one per group
    "polled-A-only": (1 << 22) | 4,  # the polled form's kernel A alone (publishing h)
    # the polled form with kernel A's arithmetic skipped (h meaningless): what it costs in the op
    "polled-A-load-only": (1 << 22) | 8192,
    # ... kernel B's arithmetic skipped (no dequantization, no MMAs), and both: what remains is
    # the op's loads, hand-off, reductions and combine
    "polled-B-load-only": (1 << 22) | (1 << 31),
    "polled-bare": (1 << 22) | 8192 | (1 << 31),
    # kernel A alone, loads only (no arithmetic, no h, no W2 prefetch): its W13 stream
    "A-load-only-w13": 8192 | 4 | 1024,
    # kernel A alone as the waiting form's (16 warps, 64 registers, arithmetic, no h published,
    # no W2 prefetch), and with 8 / 20 warps per CTA
    "A-plain-only": 256 | 4 | 1024,
    "A8-only": (1 << 6) | 4 | 1024,
    "A20-only": (3 << 6) | 4 | 1024,
    "fused": 512,
    "no-prefetch": 1024,
    "split": 4096,
    "split-no-pdl": 4096 | 16,
    "rolled-sums": 4096 | 16384,
    "B-dequant-late": 2048,
    "A-load-only": 4096 | 8192 | 4,  # split form: kernel A without its arithmetic
    "A-stream-only": 4096 | 8192 | 4 | 32768,  # split form: kernel A's loads, then it exits
}
# Not op variants, timed in the same graph: the benchmark's read floor (read_floor_m1, 4 loads
# per thread, PDL), so kernel A's loads compare with it directly, and the derive kernel alone.
FLOOR = "floor"
FLOOR_W13 = "floor-w13"  # the read floor of the W13 segments only (5.12 MB at 4-byte)
DERIVE_ONLY = "derive-only"
ROUTE_BYTES = {"4byte": 10 * 768_000, "3byte": 10 * (409_600 + 76_800 + 204_800 + 38_400)}


def make_banks(fmt: str, layers: int, experts: int = 512) -> list[ref.Banks]:
    return [
        ref.random_banks(experts, seed=100 + i, fmt=fmt, device="cuda")  # type: ignore[arg-type]
        for i in range(layers)
    ]


def capture_layers(
    banks: list[ref.Banks], path: int | str, derive: bool = False
) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
    """A CUDA graph that runs the op once per layer (each with its own banks and random
    inputs), warmed up by 20 replays, and the tensors it reads and writes: keep them alive as
    long as the graph is replayed. path FLOOR: the read floor instead of the op; DERIVE_ONLY:
    neither. derive: before each layer, `qpnserve bench op`'s derive kernel writes the layer's
    x, ids and weights from the previous layer's output (as in the benchmark's graph)."""
    dev = "cuda"
    inputs = [ref.random_inputs(200 + i, b.w13.shape[0], device=dev) for i, b in enumerate(banks)]
    sources = [tuple(t.clone() for t in triple) for triple in inputs]
    outs = [torch.zeros(1, 2560, dtype=torch.float16, device=dev) for _ in banks]
    inter = torch.empty(10, 160, dtype=torch.float16, device=dev)
    sink = torch.zeros(1 << 16, dtype=torch.int32, device=dev)

    def step() -> None:
        for i, (b, (x, ids, w), out) in enumerate(zip(banks, inputs, outs, strict=True)):
            if derive:
                seed, ids_src, w_src = sources[i]
                torch.ops.qpnserve.derive_input_m1(x, ids, w, outs[i - 1], seed, ids_src, w_src)
            if path == DERIVE_ONLY:
                continue
            if path in (FLOOR, FLOOR_W13):
                hint = 2 if path == FLOOR_W13 else 0
                torch.ops.qpnserve.read_floor_m1(sink, b.w13, b.s13, b.w2, b.s2, ids, 4, True, hint)
            else:
                torch.ops.qpnserve.awq_moe_m1_out_path(
                    out, inter, x, b.w13, b.s13, b.w2, b.s2, ids, w, int(path)
                )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(20):
        graph.replay()
    kept = [t for triple in inputs + sources for t in triple]
    return graph, [*kept, *outs, inter, sink]


def time_graph(graph: torch.cuda.CUDAGraph, layers: int, iters: int) -> float:
    """Median us per layer over iters replays of a captured graph."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 / layers for s, e in times)


def time_variants(
    banks: list[ref.Banks], paths: list[int | str], iters: int, rounds: int, derive: bool
) -> list[float]:
    """Median us per layer of each path's graph. Every graph is captured first, then timed in
    `rounds` rounds over all of them, each round in a rotated order, and the median of the
    rounds' figures kept: timed one after another, the first variant measured 0.2-0.4 us
    faster than later ones on the H200 (docs/evidence/f552b2f/experiments.md, run 4)."""
    captured = [capture_layers(banks, path, derive) for path in paths]
    per_round: list[list[float]] = [[] for _ in paths]
    for r in range(rounds):
        for k in range(len(paths)):
            i = (k + r) % len(paths)
            per_round[i].append(time_graph(captured[i][0], len(banks), iters))
    return [statistics.median(figures) for figures in per_round]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--paths", default="auto,mma884")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds over all variants (median of the rounds)"
    )
    parser.add_argument(
        "--diag",
        default="",
        help="comma list of " + ",".join([*DIAG, FLOOR, FLOOR_W13, DERIVE_ONLY]),
    )
    parser.add_argument(
        "--all-formats", action="store_true", help="the --diag variants for 3byte too"
    )
    parser.add_argument(
        "--experts",
        type=int,
        default=512,
        help="experts per layer (E); fewer shrink the banks' footprint at the same layer count",
    )
    parser.add_argument(
        "--derive",
        action="store_true",
        help="bench op's derive kernel before every layer (diag derive-only: it alone)",
    )
    args = parser.parse_args()
    loaded = build.load()
    name = torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, build {loaded.build_key} ({loaded.arch_list})")
    print(f"{'format':7} {'path':9} {'diag':12} {'us/layer':>9} {'GB/s':>7}")
    for fmt in ref.FORMATS:
        banks = make_banks(fmt, args.layers, args.experts)
        rows: list[tuple[str, str, int | str]] = []
        for path_name in args.paths.split(","):
            for diag in [""] + [d for d in args.diag.split(",") if d]:
                if diag and (path_name != "auto" or (fmt != "4byte" and not args.all_formats)):
                    continue
                if diag in (FLOOR, FLOOR_W13) and args.experts != 512:
                    print(f"{fmt:7} {path_name:9} {diag:12} {'-':>9} (read_floor_m1 needs E=512)")
                    continue
                special = (FLOOR, FLOOR_W13, DERIVE_ONLY)
                path = diag if diag in special else PATHS[path_name] | DIAG[diag]
                rows.append((path_name, diag, path))
        figures = time_variants(
            banks, [path for *_, path in rows], args.iters, args.rounds, args.derive
        )
        for (path_name, diag, _), us in zip(rows, figures, strict=True):
            gbs = ROUTE_BYTES[fmt] / (us * 1e-6) / 1e9
            print(f"{fmt:7} {path_name:9} {diag or '-':12} {us:9.2f} {gbs:7.0f}", flush=True)
        del banks
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
