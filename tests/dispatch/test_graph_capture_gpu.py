"""GPU: real CUDA graphs captured through the host's apply() at 1 and 2 rows, and what the route
report records of them: the route in the 1-token graph, not in the 2-token one. Replays run no
Python, so the record must stay as captured while the 1-token graph keeps computing the route
on new inputs (bit for bit the operator on the same experts, within the contract of the FP64
oracle) and the 2-token graph keeps the host's own route.
Run with: pytest -m gpu tests/dispatch
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG
from qpnserve.dispatch import recorder
from qpnserve.kernels.reference import oracle_detail, out_within_contract, random_banks
from qpnserve.kernels.reference import random_inputs as one_token_inputs
from qpnserve.lifecycle.route_check import describe_captures
from qpnserve.plugin import register
from qpnserve.route_report import CapturedGraph, read_reports
from tests.dispatch.standin import GROUPED_ROUTE_VALUE, FakeHost
from tests.dispatch.test_operator_route import HOST_IDS, host_layer_with
from tests.dispatch.test_operator_route_gpu import _direct

pytestmark = pytest.mark.gpu


def test_capture_at_1_and_2_rows_puts_the_route_only_in_the_1_token_graph(
    cuda_extension: Any,
    validated_fake: FakeHost,
    report_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qpnserve.kernels import build

    monkeypatch.setattr(build, "load", lambda *a, **k: cuda_extension)
    monkeypatch.setattr(recorder, "CAPTURE_FLUSH_S", 0.0)  # each capture record written at once
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    cls = validated_fake.host_class()
    banks = random_banks(10, seed=31, fmt="4byte", device="cuda")
    layer = host_layer_with(banks, "4byte", device="cuda")
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)

    # The tensors the graphs capture: x (n, 2560) fp16, weights (n, 10) fp32, ids (n, 10) int32.
    x1, _, w1 = one_token_inputs(seed=1, num_experts=10, device="cuda")
    ids1 = torch.tensor([HOST_IDS], dtype=torch.int32, device="cuda")
    x2 = torch.cat([x1, x1]).contiguous()
    w2 = torch.cat([w1, w1]).contiguous()
    ids2 = torch.cat([ids1, ids1]).contiguous()

    def step(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return method.apply(layer, x, w, ids, None, None)  # the host's own entry point

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up, as vLLM does before each capture
        step(x2, w2, ids2)
        step(x1, w1, ids1)
    torch.cuda.current_stream().wait_stream(side)
    assert read_reports(report_dir)[0].layers[0].captured == []  # eager calls: no graph
    graph2, graph1 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):  # the largest size first, as vLLM captures
        out2 = step(x2, w2, ids2)
    with torch.cuda.graph(graph1):
        out1 = step(x1, w1, ids1)

    (report,) = read_reports(report_dir)
    record = report.layers[0].captured
    print(f"capture record of {report.layers[0].layer}: {describe_captures(report.layers[0])}")
    assert record == [CapturedGraph(rows=1, route=True), CapturedGraph(rows=2, route=False)]
    assert describe_captures(report.layers[0]) == (
        "route in the 1-token graph; not in the 2-token graph"
    )

    for seed in (2, 3):
        new_x, _, new_w = one_token_inputs(seed=seed, num_experts=10, device="cuda")
        new_ids = HOST_IDS[seed:] + HOST_IDS[:seed]
        x1.copy_(new_x)
        w1.copy_(new_w)
        ids1.copy_(torch.tensor([new_ids], dtype=torch.int32))
        graph1.replay()
        torch.cuda.synchronize()
        direct_out, _ = _direct(banks, x1, new_ids, w1)
        assert torch.equal(out1, direct_out)  # the replay ran the operator on the new inputs
        local = torch.tensor([[HOST_IDS.index(e) for e in new_ids]], dtype=torch.int32)
        cpu = [t.cpu() for t in (x1, banks.w13, banks.s13, banks.w2, banks.s2)]
        ok, summary = out_within_contract(out1.cpu(), oracle_detail(*cpu, local, w1.cpu()))
        assert ok, summary
    out2.zero_()
    graph2.replay()
    torch.cuda.synchronize()
    assert torch.all(out2 == GROUPED_ROUTE_VALUE)  # the host's many-token route, replayed
    assert read_reports(report_dir)[0].layers[0].captured == record  # replays run no Python
    assert layer.host_route_calls == []
