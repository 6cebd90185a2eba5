"""The order of a `bench op` run: build banks, prove every contender right, then time.

Nothing is timed before the op's output over every layer has met the FP64 reference's bounds;
a wrong op raises CanaryError and no time is reported. After timing, the op's graph outputs
must equal its eager outputs bit for bit (the contract's determinism), or the run fails too.
The effects (graph capture, copy timing, device facts) are injectable so the order of checks
is tested on a CPU with fake ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from qpnserve.benchop import hostop
from qpnserve.benchop import report as rpt
from qpnserve.benchop.banks import LayerBanks, make_layer
from qpnserve.benchop.checks import (
    record_chain,
    verify_all_invalid,
    verify_floor,
    verify_routes,
)
from qpnserve.benchop.contenders import (
    Derive,
    FloorConfig,
    LayerState,
    dense_fp16,
    floor_contender,
    op_contender,
    prepare_dense,
    torch_route,
)
from qpnserve.benchop.route_bytes import (
    FLOOR_LOADS_PER_THREAD,
    MetaFormat,
    dense_fp16_bytes_per_call,
    floor_sink_len,
    route_bytes,
)
from qpnserve.errors import BenchError, CanaryError
from qpnserve.geometry import HIDDEN, INTERMEDIATE, NUM_EXPERTS, NUM_MOE_LAYERS, TOP_K

# Replays a recorded sequence of launches: record() -> per-replay times in milliseconds.
Timer = Callable[[Callable[[], None], int, int], list[float]]


@dataclass(frozen=True)
class BenchConfig:
    fmt: MetaFormat = "4byte"
    layers: int = NUM_MOE_LAYERS
    iters: int = 50
    rounds: int = 3
    warmup: int = 5
    seed: int = 0
    num_experts: int = NUM_EXPERTS  # tests use fewer on a CPU
    floor_variants: tuple[FloorConfig, ...] = tuple(
        FloorConfig(loads) for loads in FLOOR_LOADS_PER_THREAD
    )


def floor_variants(cache_hints: Sequence[int] = (0,)) -> tuple[FloorConfig, ...]:
    """Every load depth x the given cache hints."""
    return tuple(
        FloorConfig(loads, hint) for hint in cache_hints for loads in FLOOR_LOADS_PER_THREAD
    )


@dataclass
class BenchOps:
    """The effects: kernels and measurements. Real ones come from `cuda_ops()`."""

    op: Callable[..., None]
    floor: Callable[..., None]
    derive: Derive
    timer: Timer
    copy_gb_s: Callable[[], float]
    facts: Callable[[], rpt.DeviceFacts]
    notes: list[str] = field(default_factory=list)
    host_op: Callable[..., None] | None = None  # a native host's own op (hostop.find_host_op)


def _states(
    layers: Sequence[LayerBanks], device: torch.device, sink_len: int = 0
) -> list[LayerState]:
    states = []
    for banks in layers:
        sink = torch.zeros(max(sink_len, HIDDEN // 2), dtype=torch.int32, device=device)
        out = torch.empty(1, HIDDEN, dtype=torch.float16, device=device).fill_(float("nan"))
        if sink_len:
            out = sink[: HIDDEN // 2].view(torch.float16).view(1, HIDDEN)  # feeds the derive
        states.append(
            LayerState(
                banks=banks,
                x=torch.empty(1, HIDDEN, dtype=torch.float16, device=device),
                ids=torch.empty(1, TOP_K, dtype=torch.int32, device=device),
                weights=torch.empty(1, TOP_K, dtype=torch.float32, device=device),
                out=out,
                intermediate=torch.empty(
                    TOP_K, INTERMEDIATE, dtype=torch.float16, device=device
                ).fill_(float("nan")),
                sink=sink if sink_len else None,
            )
        )
    return states


# The same routes are replayed, so a replay may find the previous replay's routed bytes in L2
# unless they are several times its size (H200, 4-byte, 8 layers = 61 MB against 60 MiB: the op
# measured 0.8 us per layer faster than at 32 layers in a timing script since removed).
L2_REUSE_FACTOR = 3


def l2_reuse_note(layers: int, per_call: int, l2_mib: float) -> str | None:
    """A note when a replay's routed bytes are within L2_REUSE_FACTOR x the L2, else None."""
    l2_bytes = l2_mib * 2**20
    if l2_bytes <= 0 or layers * per_call >= L2_REUSE_FACTOR * l2_bytes:
        return None
    need = -(-int(L2_REUSE_FACTOR * l2_bytes) // per_call)
    return (
        f"the {layers} layers route {layers * per_call / 1e6:.0f} MB per replay, less than "
        f"{L2_REUSE_FACTOR}x the {l2_mib:.0f} MiB L2: replays may find part of it in L2, so "
        f"these times can be optimistic; use --layers {need} or more"
    )


def run_bench(
    cfg: BenchConfig,
    ops: BenchOps,
    device: torch.device,
    log: Callable[[str], None] = lambda _m: None,
) -> rpt.BenchOpReport:
    if cfg.layers < 1 or cfg.iters < 1 or cfg.rounds < 1:
        raise BenchError("layers, iters and rounds must be positive")
    rb = route_bytes(cfg.fmt)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    total_gb = cfg.layers * cfg.num_experts * rb.per_route / 1e9
    log(f"building {cfg.layers} layers of {cfg.fmt} banks ({total_gb:.1f} GB)")
    layers = [make_layer(cfg.fmt, gen, device, cfg.num_experts) for _ in range(cfg.layers)]

    # 1. Correctness before any timing: the op first, so a wrong op stops everything.
    op_states = _states(layers, device)
    op_run = op_contender(ops.op)
    log("checking the op against the FP64 reference on every layer")
    op_verified = verify_routes("op", op_states, ops.derive, op_run, with_h=True)
    eager_out = [st.out.clone() for st in op_states]
    eager_h = [st.intermediate.clone() for st in op_states]

    variants = list(cfg.floor_variants)
    sink_len = max(floor_sink_len(cfg.fmt, v.loads_per_thread) for v in variants)
    floor_states = _states(layers, device, sink_len)
    floor_runs = {v: floor_contender(ops.floor, v) for v in variants}
    log("checking that each read-floor variant reads every routed byte once")
    errors: dict[str, str] = {}  # per floor variant: why it was not timed
    for v, run in floor_runs.items():
        try:
            verify_floor(floor_states, ops.derive, run)
        except (BenchError, RuntimeError) as exc:  # that variant is dropped, never reported
            errors[f"floor:{v.label}"] = str(exc).splitlines()[0][:200]
    if len(errors) == len(floor_runs):
        reasons = "; ".join(errors.values())
        raise BenchError(f"no read-floor variant read the routed bytes: {reasons}")

    # Fixed costs: the op and the floor with every id invalid read no weights, so their graph
    # time is launch, scheduling and the op's zero-fill alone.
    empty_layers = [replace(b, route_ids=torch.full_like(b.route_ids, -1)) for b in layers]
    op_empty_states = _states(empty_layers, device)
    verify_all_invalid(op_empty_states, ops.derive, op_run)
    empty_floor = FloorConfig(4)
    floor_empty_states = _states(empty_layers, device, sink_len)
    floor_empty_run = floor_contender(ops.floor, empty_floor)
    verify_floor(floor_empty_states, ops.derive, floor_empty_run)

    host_run, host_note = None, None
    if ops.host_op is not None:
        log("checking the host's own op against the FP64 reference on every layer")
        host_run, host_note = hostop.prepare(ops.host_op, _states(layers, device), ops.derive)

    torch_states = _states(layers, device)
    verified_torch = verify_routes("torch route", torch_states, ops.derive, torch_route, False)
    dense_states = _states(layers, device)
    for st in dense_states:
        prepare_dense(st)
    verified_dense = verify_routes("dense fp16", dense_states, ops.derive, dense_fp16, False)

    # 2. Timing: every contender in its own graph of `layers` (derive, contender) pairs.
    copy_gb_s = ops.copy_gb_s()
    log(f"copy bandwidth {copy_gb_s:,.0f} GB/s; timing graphs")
    recorders: dict[str, Callable[[], None]] = {
        "derive": record_chain(op_states, ops.derive, None),
        "op": record_chain(op_states, ops.derive, op_run),
        "torch_route": record_chain(torch_states, ops.derive, torch_route),
        "dense_fp16": record_chain(dense_states, ops.derive, dense_fp16),
    }
    for v, run in floor_runs.items():
        if f"floor:{v.label}" not in errors:
            recorders[f"floor:{v.label}"] = record_chain(floor_states, ops.derive, run)
    recorders["op_empty"] = record_chain(op_empty_states, ops.derive, op_run)
    recorders["floor_empty"] = record_chain(floor_empty_states, ops.derive, floor_empty_run)
    if host_run is not None:
        recorders["host_op"] = host_run.record
    samples: dict[str, list[float]] = {name: [] for name in recorders}
    for _round in range(cfg.rounds):
        for name, record in recorders.items():
            if name in errors:
                continue
            try:
                replay_ms = ops.timer(record, cfg.iters, cfg.warmup)
            except RuntimeError as exc:  # e.g. a variant the graph capture rejects
                if not name.startswith("floor:"):
                    raise BenchError(f"timing {name} failed: {exc}") from exc
                errors[name] = str(exc).splitlines()[0][:200]
                continue
            samples[name].extend(rpt.per_layer_us(replay_ms, cfg.layers))

    # 3. The graph must have computed exactly what the eager chain did.
    for layer, st in enumerate(op_states):
        if not (
            torch.equal(st.out, eager_out[layer]) and torch.equal(st.intermediate, eager_h[layer])
        ):
            raise CanaryError(
                f"op: layer {layer} differs between CUDA-graph replay and eager; "
                "no time is reported",
                hint="the op must be deterministic and graph-safe (contract section 4)",
            )

    facts = ops.facts()
    notes = list(ops.notes)
    reuse = l2_reuse_note(cfg.layers, rb.per_call, facts.l2_mib)
    if reuse:
        notes.append(reuse)
    if host_note:
        notes.append(host_note)
    derive_us = rpt.spread(samples["derive"]).median_us
    result = _results(
        variants,
        rb.per_call,
        copy_gb_s,
        derive_us,
        samples,
        errors,
        op_verified,
        verified_torch,
        verified_dense,
    )
    op_res, floor_res, torch_res, dense_res, floor_variants = result
    host_res = None
    if host_run is not None:
        host_res = rpt.contender_result(
            "host_op", hostop.WHAT, samples["host_op"], derive_us, rb.per_call, rb.per_call,
            copy_gb_s, host_run.verified,
        )  # fmt: skip
    return rpt.BenchOpReport(
        format=cfg.fmt,
        layers=cfg.layers,
        iters=cfg.iters,
        rounds=cfg.rounds,
        seed=cfg.seed,
        route_bytes=rpt.route_bytes_model(rb),
        bank_bytes_total=cfg.layers * cfg.num_experts * rb.per_route,
        copy_gb_s=copy_gb_s,
        derive_us=derive_us,
        op=op_res,
        floor=floor_res,
        floor_variants=floor_variants,
        torch_route=torch_res,
        dense_fp16=dense_res,
        host_op=host_res,
        ratios=rpt.ratios(op_res, floor_res, torch_res, dense_res, host_res),
        empty_routes=rpt.EmptyRoutes(
            op_net_us=rpt.spread(samples["op_empty"]).median_us - derive_us,
            floor_net_us=rpt.spread(samples["floor_empty"]).median_us - derive_us,
            floor_variant=empty_floor.what,
        ),
        device=facts,
        notes=notes,
    )


def _results(
    variants_run: Sequence[FloorConfig],
    per_call: int,
    copy_gb_s: float,
    derive_us: float,
    samples: dict[str, list[float]],
    errors: dict[str, str],
    op_verified: str,
    verified_torch: str,
    verified_dense: str,
) -> tuple[
    rpt.ContenderResult,
    rpt.ContenderResult,
    rpt.ContenderResult,
    rpt.ContenderResult,
    list[rpt.FloorVariant],
]:
    def result(name: str, what: str, key: str, nbytes: int, verified: str) -> rpt.ContenderResult:
        return rpt.contender_result(
            name, what, samples[key], derive_us, nbytes, per_call, copy_gb_s, verified
        )

    variants = []
    best: FloorConfig | None = None
    best_us = float("inf")
    for v in variants_run:
        key = f"floor:{v.label}"
        median = rpt.spread(samples[key]).median_us if samples.get(key) else None
        variants.append(
            rpt.FloorVariant(
                loads_per_thread=v.loads_per_thread,
                cache_hint=v.cache_hint,
                layer_median_us=None if key in errors else median,
                net_us=None if key in errors or median is None else median - derive_us,
                error=errors.get(key, None if median is not None else "no samples"),
            )
        )
        if key in errors or median is None:
            continue
        if median < best_us:
            best, best_us = v, median
    if best is None:
        raise BenchError("no read-floor variant could be timed: " + "; ".join(errors.values()))
    best_key = f"floor:{best.label}"
    floor_what = f"read_floor_m1, fastest variant: {best.what}"
    op_res = result("op", "qpnserve::awq_moe_m1_out", "op", per_call, op_verified)
    floor_res = result(
        "floor",
        floor_what,
        best_key,
        per_call,
        "wrapping sum of every routed word matched, every variant, every layer",
    )
    torch_res = result(
        "torch_route",
        "plain PyTorch: gather, unpack, dequantize, bmm, SwiGLU, bmm, weighted sum",
        "torch_route",
        per_call,
        verified_torch,
    )
    dense_res = result(
        "dense_fp16",
        "cuBLAS bmm over pre-dequantized FP16 weights of the ten experts",
        "dense_fp16",
        dense_fp16_bytes_per_call(),
        verified_dense,
    )
    return op_res, floor_res, torch_res, dense_res, variants
