"""The `bench op` result: pydantic model, the pure arithmetic that fills it, and the table.

Times are per layer. A contender's graph runs, per layer, the derive kernel and then the
contender; `layer_us` is that pair, `net_us` subtracts the derive-only graph's time per layer,
and every ratio and GB/s figure uses `net_us` (the stricter choice: a constant added to both
sides of a ratio above 1 would pull it toward 1).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel, Field

from qpnserve.benchop import v100_projection
from qpnserve.benchop.route_bytes import MetaFormat, RouteBytes


class Spread(BaseModel):
    """Per-layer times of one contender, in microseconds, over every timed graph replay."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    samples: int


class ContenderResult(BaseModel):
    name: str
    what: str
    layer: Spread  # derive kernel + contender, per layer
    net_us: float  # layer.median_us - derive_us
    bytes_per_layer: int  # bytes this contender must stream per call
    effective_gb_s: float  # bytes the ten routes must read / net_us (same bytes for everyone)
    own_bytes_gb_s: float  # bytes_per_layer / net_us
    copy_fraction: float  # effective_gb_s / copy_gb_s
    verified: str


class FloorVariant(BaseModel):
    loads_per_thread: int
    cache_hint: int = 0  # 0: ld.global.cs; 1: L1 no-allocate + L2 256 B prefetch
    layer_median_us: float | None
    net_us: float | None
    error: str | None = None


class DeviceFacts(BaseModel):
    gpu_name: str
    compute_capability: str
    sm_count: int
    l2_mib: float
    mem_gib: float
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    driver: str | None = None
    torch_version: str
    cuda_version: str | None
    git_commit: str


class RouteBytesModel(BaseModel):
    w13_weight: int
    w13_meta: int
    w2_weight: int
    w2_meta: int
    per_route: int
    per_call: int


class Ratios(BaseModel):
    op_to_floor: float  # the target: <= 1.15 (1.35 the least to call it done)
    op_to_floor_gross: float  # same, with the derive kernel left in both
    op_copy_fraction: float
    floor_copy_fraction: float
    torch_route_to_op: float  # how many times slower the plain PyTorch route is
    dense_fp16_to_op: float
    host_op_to_op: float | None = None  # the host's own op / ours, net (None: not timed)


class EmptyRoutes(BaseModel):
    """Net per-layer time with every id invalid (nothing to read): the fixed cost of a launch."""

    op_net_us: float
    floor_net_us: float
    floor_variant: str


class BenchOpReport(BaseModel):
    schema_version: int = 2  # 2: floor variants lost version 1's always-false `pdl` field
    format: MetaFormat
    layers: int
    iters: int
    rounds: int
    seed: int
    route_bytes: RouteBytesModel
    bank_bytes_total: int = Field(description="all layers' banks, far above the L2 size")
    copy_gb_s: float = Field(description="device-to-device copy, bytes read + written / time")
    derive_us: float = Field(description="the derive kernel alone, per layer, in its own graph")
    op: ContenderResult
    floor: ContenderResult
    floor_variants: list[FloorVariant]
    torch_route: ContenderResult
    dense_fp16: ContenderResult
    host_op: ContenderResult | None = None  # a native host's own op; None: absent or not timed
    ratios: Ratios
    empty_routes: EmptyRoutes | None = None
    device: DeviceFacts
    notes: list[str] = []


def spread(layer_times_us: Sequence[float]) -> Spread:
    """Median, 10th and 90th percentile and minimum of per-layer times (nearest rank)."""
    if not layer_times_us:
        raise ValueError("no samples")
    ordered = sorted(layer_times_us)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, round(q * (n - 1))))]

    return Spread(
        median_us=statistics.median(ordered),
        p10_us=rank(0.10),
        p90_us=rank(0.90),
        min_us=ordered[0],
        samples=n,
    )


def per_layer_us(replay_ms: Sequence[float], layers: int) -> list[float]:
    """Graph replay times (ms, as CUDA events give them) to microseconds per layer."""
    if layers <= 0:
        raise ValueError("layers must be positive")
    return [t * 1000.0 / layers for t in replay_ms]


def gb_per_s(num_bytes: int, time_us: float) -> float:
    """Bytes over microseconds, in GB/s (1e9 B/s)."""
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us} us")
    return num_bytes / time_us / 1e3


def contender_result(
    name: str,
    what: str,
    layer_us: Sequence[float],
    derive_us: float,
    bytes_per_layer: int,
    route_bytes_per_call: int,
    copy_gb_s: float,
    verified: str,
) -> ContenderResult:
    layer = spread(layer_us)
    # A contender faster than the derive graph alone would give a net time <= 0: that is a
    # measurement problem, not a speed, so clamp to a tiny positive value and let ratios show it.
    net_us = max(layer.median_us - derive_us, 1e-3)
    effective = gb_per_s(route_bytes_per_call, net_us)
    return ContenderResult(
        name=name,
        what=what,
        layer=layer,
        net_us=net_us,
        bytes_per_layer=bytes_per_layer,
        effective_gb_s=effective,
        own_bytes_gb_s=gb_per_s(bytes_per_layer, net_us),
        copy_fraction=effective / copy_gb_s,
        verified=verified,
    )


def ratios(
    op: ContenderResult,
    floor: ContenderResult,
    torch_route: ContenderResult,
    dense: ContenderResult,
    host_op: ContenderResult | None = None,
) -> Ratios:
    return Ratios(
        op_to_floor=op.net_us / floor.net_us,
        op_to_floor_gross=op.layer.median_us / floor.layer.median_us,
        op_copy_fraction=op.copy_fraction,
        floor_copy_fraction=floor.copy_fraction,
        torch_route_to_op=torch_route.net_us / op.net_us,
        dense_fp16_to_op=dense.net_us / op.net_us,
        host_op_to_op=host_op.net_us / op.net_us if host_op is not None else None,
    )


def route_bytes_model(rb: RouteBytes) -> RouteBytesModel:
    return RouteBytesModel(
        w13_weight=rb.w13_weight,
        w13_meta=rb.w13_meta,
        w2_weight=rb.w2_weight,
        w2_meta=rb.w2_meta,
        per_route=rb.per_route,
        per_call=rb.per_call,
    )


def render_table(report: BenchOpReport) -> str:
    """The human table (stderr): one line per contender, then ratios and the hardware."""
    d = report.device
    clocks = (
        f"SM {d.sm_clock_mhz}/{d.max_sm_clock_mhz} MHz, mem {d.mem_clock_mhz}/"
        f"{d.max_mem_clock_mhz} MHz"
        if d.sm_clock_mhz is not None
        else "clocks not readable"
    )
    lines = [
        f"qpnserve bench op: format {report.format}, {report.layers} layers, "
        f"{report.iters} replays x {report.rounds} rounds",
        f"{d.gpu_name} (sm_{d.compute_capability.replace('.', '')}, {d.sm_count} SMs, "
        f"L2 {d.l2_mib:.0f} MiB), {clocks}; torch {d.torch_version}, CUDA {d.cuda_version}, "
        f"commit {d.git_commit}",
        f"bytes per call {report.route_bytes.per_call:,} B; "
        f"banks {report.bank_bytes_total / 1e9:.1f} GB; copy {report.copy_gb_s:,.0f} GB/s; "
        f"derive kernel {report.derive_us:.2f} us/layer",
        f"{'contender':<12} {'layer us':>9} {'net us':>8} {'p10-p90 us':>13} {'GB/s':>7} "
        f"{'of copy':>8}",
    ]
    contenders = [report.op, report.floor, report.torch_route, report.dense_fp16]
    for c in contenders + ([report.host_op] if report.host_op is not None else []):
        lines.append(
            f"{c.name:<12} {c.layer.median_us:9.2f} {c.net_us:8.2f} "
            f"{c.layer.p10_us:6.2f}-{c.layer.p90_us:<6.2f} {c.effective_gb_s:7.0f} "
            f"{c.copy_fraction:8.1%}"
        )
    r = report.ratios
    lines.append(
        f"op/floor {r.op_to_floor:.3f} (gross {r.op_to_floor_gross:.3f}; target <= 1.15); "
        f"torch route {r.torch_route_to_op:.1f}x op; dense fp16 {r.dense_fp16_to_op:.2f}x op"
        + (f"; host op {r.host_op_to_op:.2f}x op" if r.host_op_to_op is not None else "")
    )
    best = ", ".join(
        f"L{v.loads_per_thread}{'+pf256' if v.cache_hint else ''} "
        + (f"{v.net_us:.2f}" if v.net_us is not None else f"failed: {v.error}")
        for v in report.floor_variants
    )
    lines.append(f"floor variants (net us): {best}")
    if report.empty_routes is not None:
        e = report.empty_routes
        lines.append(
            f"all ids invalid (fixed cost, net us): op {e.op_net_us:.2f}, floor "
            f"{e.floor_net_us:.2f} ({e.floor_variant})"
        )
    if d.compute_capability == "7.0":  # a V100: the model's projection beside the measurement
        lines.extend(v100_projection.lines(report.format, report.op.net_us))
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)
