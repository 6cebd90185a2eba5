"""The checks a contender must pass before (and after) it is timed. Each raises on failure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from qpnserve.benchop.banks import floor_expected_sum
from qpnserve.benchop.contenders import Contender, Derive, LayerState
from qpnserve.errors import BenchError, CanaryError
from qpnserve.kernels import reference


def run_chain(states: Sequence[LayerState], derive: Derive, contender: Contender | None) -> None:
    """One decode step, eagerly: per layer, derive x/ids/weights, then run the contender."""
    record_chain(states, derive, contender)()


def record_chain(
    states: Sequence[LayerState], derive: Derive, contender: Contender | None
) -> Callable[[], None]:
    """The launches of one decode step, as a function a CUDA graph can capture."""
    first_prev = torch.zeros_like(states[0].x)  # allocated outside the graph

    def record() -> None:
        for i, st in enumerate(states):
            prev = states[i - 1].out if i else first_prev
            b = st.banks
            derive(st.x, st.ids, st.weights, prev, b.seed, b.route_ids, b.route_weights)
            if contender is not None:
                contender(st)

    return record


def verify_routes(
    name: str, states: Sequence[LayerState], derive: Derive, contender: Contender, with_h: bool
) -> str:
    """Run the chain eagerly and check every layer against the FP64 oracle (contract section 4).

    Only the ten routed experts go to the CPU (about 7.7 MB a layer), so the oracle is the
    operator's own test oracle, `qpnserve.kernels.reference`, with its bounds.
    """
    run_chain(states, derive, contender)
    worst = 0.0
    for layer, st in enumerate(states):
        ok, why, ratio = _check_layer(st, with_h)
        if not ok:
            raise CanaryError(
                f"{name}: layer {layer} output is wrong ({why}); no time is reported",
                hint="fix the operator until `pytest -m gpu tests/kernels` passes, then rerun",
            )
        worst = max(worst, ratio)
    return f"all {len(states)} layers within contract bounds (worst max|diff|/max|ref| {worst:.2e})"


def _check_layer(st: LayerState, with_h: bool) -> tuple[bool, str, float]:
    """(ok, reason, max|diff| / max|ref| of out) of one layer's outputs against the oracle."""
    ids = st.ids.view(-1).to(torch.int64).cpu()
    b = st.banks
    # Only the routed experts, renumbered in router order; an invalid id stays invalid (-1).
    valid = (ids >= 0) & (ids < b.w13.shape[0])
    routed = ids[valid].to(b.w13.device)
    w13, s13, w2, s2 = (t[routed].cpu() for t in (b.w13, b.s13, b.w2, b.s2))
    local_ids = torch.full_like(ids, -1)
    local_ids[valid] = torch.arange(int(valid.sum()))
    local_ids = local_ids.to(torch.int32).view(1, -1)
    want = reference.oracle_detail(st.x.cpu(), w13, s13, w2, s2, local_ids, st.weights.cpu())
    ok, why = reference.out_within_contract(st.out.cpu(), want)
    why = f"out: {why}"
    if ok and with_h:
        ok, why = reference.intermediate_within_contract(st.intermediate.cpu(), want)
        why = f"intermediate: {why}"
    out = st.out.cpu().to(torch.float64).numpy()
    max_ref = max(float(abs(want.out_abs_ref).max()), 2.0**-24)
    return ok, why, float(abs(out - want.out.astype("float64")).max()) / max_ref


def verify_floor(states: Sequence[LayerState], derive: Derive, contender: Contender) -> None:
    for st in states:
        assert st.sink is not None
        st.sink.zero_()
    run_chain(states, derive, contender)
    for layer, st in enumerate(states):
        assert st.sink is not None
        got = int(st.sink.to(torch.int64).sum()) & 0xFFFFFFFF
        want = floor_expected_sum(st.banks, st.ids)
        if got != want:
            raise BenchError(
                f"read floor: layer {layer} did not read the routed bytes exactly once "
                f"(sum {got:#010x}, expected {want:#010x})"
            )


def verify_all_invalid(states: Sequence[LayerState], derive: Derive, contender: Contender) -> None:
    """With every id invalid, out and intermediate must be all zero (contract section 4)."""
    run_chain(states, derive, contender)
    for layer, st in enumerate(states):
        if bool(st.out.any()) or bool(st.intermediate.any()):
            raise CanaryError(f"op: layer {layer} with all ids invalid is not all zero")
