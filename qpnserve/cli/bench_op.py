"""CLI: `qpnserve bench op`, the operator against its read floor on the local GPU.

Exit codes: 0 timed; 2 bad option; 3 the extension cannot be built or loaded; 7 the op's
output is wrong (then no time is reported); 1 anything else that stopped the benchmark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import typer

from qpnserve.cli.app import bench_app, emit_json, handles_errors, message, settings
from qpnserve.config import BENCH_OP_FORMAT, BENCH_OP_ITERS, BENCH_OP_LAYERS
from qpnserve.geometry import NUM_MOE_LAYERS

if TYPE_CHECKING:
    from qpnserve.benchop.route_bytes import MetaFormat

# The keys of qpnserve.benchop.cuda.OP_PATHS, kept here so that option checks import no torch.
OP_PATH_NAMES = ("auto", "v100")


@bench_app.command("op")
@handles_errors
def bench_op(
    ctx: typer.Context,
    fmt: str = typer.Option(
        "4byte", "--format", envvar=BENCH_OP_FORMAT.name, help="Metadata format: 4byte or 3byte."
    ),
    layers: int = typer.Option(
        NUM_MOE_LAYERS,
        "--layers",
        envvar=BENCH_OP_LAYERS.name,
        help=(
            "Distinct layers of banks (48: 369 MB routed per replay at 4byte, 6x an H200's L2; "
            "fewer than 3x the L2 is noted in the report as possibly optimistic)."
        ),
    ),
    iters: int = typer.Option(
        50, "--iters", envvar=BENCH_OP_ITERS.name, help="Timed graph replays per round."
    ),
    rounds: int = typer.Option(3, "--rounds", help="Rounds over all contenders (drift check)."),
    seed: int = typer.Option(0, "--seed", help="Seed of banks, routes and inputs."),
    op_path: str = typer.Option(
        "auto",
        "--op-path",
        help="The op's path: auto (the device's default: on sm_90 the polled hand-off of h,"
        " elsewhere the V100 design) or v100 (the V100 design, m8n8k4, on any GPU: on a newer"
        " GPU its correctness and its time there, not a V100's speed).",
    ),
    prefetch_floor: bool = typer.Option(
        False,
        "--prefetch-floor",
        help="Also time read-floor variants with L1 no-allocate + L2 256 B prefetch loads.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Time the op per layer in a CUDA graph against the read floor, the copy bandwidth, a plain
    PyTorch route and an FP16 cuBLAS baseline; refuse to time a wrong result."""
    from qpnserve.errors import BenchError, UsageError

    if fmt not in ("4byte", "3byte"):
        raise UsageError(f"--format must be 4byte or 3byte, got {fmt!r}")
    if op_path not in OP_PATH_NAMES:
        names = ", ".join(OP_PATH_NAMES)
        raise UsageError(f"--op-path must be one of {names}, got {op_path!r}")
    for name, value in (("--layers", layers), ("--iters", iters), ("--rounds", rounds)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")

    import torch

    from qpnserve.benchop.cuda import cuda_ops
    from qpnserve.benchop.report import render_table
    from qpnserve.benchop.runner import BenchConfig, floor_variants, run_bench
    from qpnserve.kernels.build import build

    device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    found = settings(ctx)
    ops = cuda_ops(
        device,
        lambda: build(progress=message, build_dir=found.build_dir),
        op_path,
        recorded_commit=found.git_commit,
    )
    meta_format = cast("MetaFormat", fmt)
    cfg = BenchConfig(
        fmt=meta_format,
        layers=layers,
        iters=iters,
        rounds=rounds,
        seed=seed,
        floor_variants=floor_variants((0, 1) if prefetch_floor else (0,)),
    )
    try:
        report = run_bench(cfg, ops, device, log=message)
    except RuntimeError as exc:  # CUDA errors and out-of-memory surface as RuntimeError
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise BenchError(
            f"bench op stopped: {first_line}",
            hint="fewer --layers needs less GPU memory; a CUDA error may need a rebuild "
            "(qpnserve build --force)",
        ) from None
    message(render_table(report))
    if as_json:
        emit_json(report)
