"""CLI: `qpnserve bench op`, the operator against its read floor on the local GPU.

Exit codes: 0 timed; 2 bad option; 3 the extensions cannot be built or loaded (or torch is
missing); 7 the op's output is wrong (then no time is reported); 1 anything else that stopped
the benchmark. With --json, stdout holds exactly one document, a failure's too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from qpnserve.cli.app import bench_app, emit_json, handles_errors, message, settings
from qpnserve.config import BENCH_OP_FORMAT, BENCH_OP_ITERS, BENCH_OP_LAYERS, Settings
from qpnserve.geometry import NUM_MOE_LAYERS

if TYPE_CHECKING:
    from qpnserve.benchop.route_bytes import MetaFormat

# The op has one CUDA form, the V100 design; --op-path keeps its one value so that scripts of
# earlier versions that pinned it still run. The others named forms that are gone.
OP_PATH_NAMES = ("v100",)
TRACE_LAYERS = 8  # layers of banks the trace cycles through (3 GB: the bytes come from DRAM)
TRACE_REPEATS = 5


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
        "v100",
        "--op-path",
        help="The op's CUDA form: v100, the only one (the V100 design, m8n8k4, on every GPU; "
        "on a newer GPU its correctness and its time there, not a V100's speed).",
    ),
    prefetch_floor: bool = typer.Option(
        False,
        "--prefetch-floor",
        help="Also time read-floor variants with L1 no-allocate + L2 256 B prefetch loads.",
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        help="Also write the op's per-CTA timeline (the bench extension's traced copy: routed "
        "and all-invalid ids, with and without the grid barrier) as JSON to this file.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Time the op per layer in a CUDA graph against the read floor, the copy bandwidth, a plain
    PyTorch route and an FP16 cuBLAS baseline; refuse to time a wrong result."""
    _bench_op(
        fmt, layers, iters, rounds, seed, op_path, prefetch_floor, trace, as_json, settings(ctx)
    )


def _check_options(fmt: str, op_path: str, layers: int, iters: int, rounds: int) -> None:
    from qpnserve.errors import UsageError

    if fmt not in ("4byte", "3byte"):
        raise UsageError(f"--format must be 4byte or 3byte, got {fmt!r}")
    if op_path not in OP_PATH_NAMES:
        raise UsageError(
            f"--op-path {op_path!r} is gone: the op has one CUDA form, the V100 design",
            hint="drop --op-path (or pass --op-path v100)",
        )
    for name, value in (("--layers", layers), ("--iters", iters), ("--rounds", rounds)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")


def _bench_op(
    fmt: str,
    layers: int,
    iters: int,
    rounds: int,
    seed: int,
    op_path: str,
    prefetch_floor: bool,
    trace: Path | None,
    as_json: bool,
    found: Settings,
) -> None:
    from qpnserve.errors import BenchError
    from qpnserve.kernels import toolchain

    _check_options(fmt, op_path, layers, iters, rounds)
    torch = toolchain.require_torch(
        "bench op cannot run", hint="run it on the GPU host with the host's Python and torch"
    )

    from qpnserve.benchop.cuda import cuda_ops
    from qpnserve.benchop.report import render_table
    from qpnserve.benchop.runner import BenchConfig, floor_variants, run_bench
    from qpnserve.kernels.build import build

    device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    ops = cuda_ops(
        device,
        lambda: build(progress=message, build_dir=found.build_dir),
        lambda: build(progress=message, target="bench", build_dir=found.build_dir),
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
        if trace is not None:
            _write_trace(trace, meta_format, seed, device, report.device.model_dump())
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


def _write_trace(
    path: Path, fmt: MetaFormat, seed: int, device: object, facts: dict[str, object]
) -> None:
    import sys
    from dataclasses import replace

    import torch

    from qpnserve.benchop.banks import make_layer
    from qpnserve.benchop.cuda import traced_call
    from qpnserve.benchop.trace import run_trace
    from qpnserve.fsutil import atomic_write_text

    assert isinstance(device, torch.device)
    message(f"tracing the op per CTA ({TRACE_LAYERS} layers x {TRACE_REPEATS} repeats x 4 runs)")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    banks = [make_layer(fmt, gen, device) for _ in range(TRACE_LAYERS)]
    empty = [replace(banks[0], route_ids=torch.full_like(banks[0].route_ids, -1))]
    result = run_trace(traced_call(device), banks, empty, TRACE_REPEATS)
    document = {
        "kind": "qpnserve.op_trace",
        "format": fmt,
        "seed": seed,
        "layers": TRACE_LAYERS,
        "repeats": TRACE_REPEATS,
        "command": " ".join(["qpnserve", *sys.argv[1:]]),
        "device": facts,
        **result,
    }
    atomic_write_text(path, _dump_trace(document), mode=0o644)
    message(f"trace written to {path}")


def _dump_trace(document: dict[str, object]) -> str:
    """JSON with one line per CTA of the raw stamps (indented, one number a line, the two raw
    calls of eight scenarios would be ~250 KB to read through)."""
    import json

    rows: list[str] = []

    def compact(value: object) -> object:
        if isinstance(value, dict):
            return {k: compact(v) for k, v in value.items()}
        if isinstance(value, list) and value and isinstance(value[0], list):
            if value[0] and isinstance(value[0][0], list) and not isinstance(value[0][0][0], list):
                rows.extend(json.dumps(cta, separators=(",", ":")) for cta in value)
                return [f"@row{len(rows) - len(value) + i}@" for i in range(len(value))]
            return [compact(v) for v in value]
        return value

    text = json.dumps(compact(document), indent=1)
    for i, row in enumerate(rows):
        text = text.replace(f'"@row{i}@"', row, 1)
    return text + "\n"
