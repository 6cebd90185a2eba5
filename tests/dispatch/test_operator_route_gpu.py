"""GPU: the wrapped host method on CUDA tensors, eager and inside a captured CUDA graph.

The admission is decided from static properties only, so a graph captured on a one-token call
must replay the operator, reading the host's banks in place, with whatever new x, ids and
weights the host copies into the captured tensors: bit-identical to an eager call on the same
inputs and to a direct operator call on the same ten experts.
Run with: pytest -m gpu tests/dispatch
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG
from qpnserve.kernels.reference import (
    oracle_detail,
    out_within_contract,
    random_banks,
    random_inputs,
)
from qpnserve.plugin import register
from tests.dispatch.standin import FakeHost
from tests.dispatch.test_operator_route import HOST_IDS, host_layer_with

pytestmark = pytest.mark.gpu


def _direct(banks: Any, x: Any, host_ids: list[int], weights: Any) -> tuple[Any, Any]:
    """The operator on the 10-expert bank itself, ids mapped back to 0..9."""
    local = torch.tensor([[HOST_IDS.index(e) for e in host_ids]], dtype=torch.int32, device="cuda")
    out = torch.empty(1, 2560, dtype=torch.float16, device="cuda")
    inter = torch.empty(10, 160, dtype=torch.float16, device="cuda")
    torch.ops.qpnserve.awq_moe_m1_out(
        out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, local, weights
    )
    return out, inter


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_wrapped_call_replays_in_cuda_graph_with_new_inputs(
    fmt: str,
    cuda_extension: Any,
    validated_fake: FakeHost,
    report_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qpnserve.kernels import build

    monkeypatch.setattr(build, "load", lambda *a, **k: cuda_extension)
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    cls = validated_fake.host_class()
    banks = random_banks(10, seed=21, fmt=fmt, device="cuda")  # type: ignore[arg-type]
    layer = host_layer_with(banks, fmt, device="cuda")
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)

    # The captured tensors: (1,2560) fp16, (1,10) fp32, (1,10) int32, out, (10,160) scratch.
    x, _, weights = random_inputs(seed=1, num_experts=10, device="cuda")
    ids = torch.tensor([HOST_IDS], dtype=torch.int32, device="cuda")
    out = torch.empty(1, 2560, dtype=torch.float16, device="cuda")
    inter = torch.empty(10, 160, dtype=torch.float16, device="cuda")

    def step() -> Any:
        return method._apply_legacy_single_token_compact(
            layer, x, weights, ids, {"intermediate": inter}, 10, out
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert step() is out  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for seed in (2, 3):
        new_x, _, new_w = random_inputs(seed=seed, num_experts=10, device="cuda")
        new_ids = HOST_IDS[seed:] + HOST_IDS[:seed]
        x.copy_(new_x)
        weights.copy_(new_w)
        ids.copy_(torch.tensor([new_ids], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        replayed_out, replayed_inter = out.clone(), inter.clone()
        step()
        torch.cuda.synchronize()
        assert torch.equal(replayed_out, out) and torch.equal(replayed_inter, inter)
        direct_out, direct_inter = _direct(banks, x, new_ids, weights)
        assert torch.equal(replayed_out, direct_out) and torch.equal(replayed_inter, direct_inter)
        local = torch.tensor([[HOST_IDS.index(e) for e in new_ids]], dtype=torch.int32)
        cpu = [t.cpu() for t in (x, banks.w13, banks.s13, banks.w2, banks.s2)]
        ref = oracle_detail(*cpu, local, weights.cpu())
        ok, summary = out_within_contract(replayed_out.cpu(), ref)
        assert ok, summary
    assert layer.host_route_calls == []
