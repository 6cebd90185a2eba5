"""The checks a contender must pass before (and after) it is timed. Each raises on failure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from qpnserve.benchop.banks import check_route_output, floor_expected_sum, reference_route
from qpnserve.benchop.contenders import Contender, Derive, LayerState
from qpnserve.errors import BenchError, CanaryError


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
    """Run the chain eagerly and check every layer against the FP64 reference."""
    run_chain(states, derive, contender)
    worst = 0.0
    for layer, st in enumerate(states):
        ref = reference_route(st.x, st.banks, st.ids, st.weights)
        result = check_route_output(st.out, ref, st.intermediate if with_h else None)
        if not result.ok:
            raise CanaryError(
                f"{name}: layer {layer} output is wrong ({result.reason}); no time is reported",
                hint="fix the operator until `pytest -m gpu tests/kernels` passes, then rerun",
            )
        worst = max(worst, result.out_max_abs_diff / max(result.out_max_abs_ref, 2.0**-24))
    return f"all {len(states)} layers within contract bounds (worst max|diff|/max|ref| {worst:.2e})"


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
