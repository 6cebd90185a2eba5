"""The admitted call through the real operator (its CPU implementation): the wrapped host method
reads the host's own 512-expert banks in place and writes the host's own output and scratch,
bit for bit what the operator gives on the same experts, and within the contract of the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qpnserve.config import ROUTE_FLAG
from qpnserve.kernels.reference import (
    fp16_ulp_distance,
    oracle_detail,
    out_within_contract,
    random_banks,
    random_inputs,
)
from qpnserve.plugin import register
from qpnserve.route_report import read_reports
from tests.dispatch.standin import FakeHost, StandInLayer, prepared_banks

# Where the ten routed experts sit among the host's 512 (first, last, duplicates excluded).
HOST_IDS = [3, 511, 0, 100, 250, 7, 42, 300, 499, 64]


def host_layer_with(banks: Any, fmt: str, device: str = "cpu") -> StandInLayer:
    """A 512-expert host layer whose experts HOST_IDS[r] are expert r of ``banks``."""
    metadata = "int32" if fmt == "4byte" else "uint8"
    prepared = prepared_banks(metadata=metadata, device=device)
    for r, e in enumerate(HOST_IDS):
        prepared["w13_tm_weight"][e] = banks.w13[r]
        prepared["w13_tm_scales"][e] = banks.s13[r]
        prepared["w2_tm_weight"][e] = banks.w2[r]
        prepared["w2_tm_scales"][e] = banks.s2[r]
    return StandInLayer(stand_in_prepared=prepared)


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_admitted_call_runs_operator_on_host_banks(
    fmt: str,
    cpu_extension: Any,
    validated_fake: FakeHost,
    report_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qpnserve.kernels import build

    monkeypatch.setattr(build, "load", lambda *a, **k: cpu_extension)  # the CPU build
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    cls = validated_fake.host_class()

    banks = random_banks(10, seed=11, fmt=fmt)  # type: ignore[arg-type]
    x, _, weights = random_inputs(seed=5, num_experts=10)
    layer = host_layer_with(banks, fmt)
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)
    (report,) = read_reports(report_dir)
    assert report.build_key == cpu_extension.build_key and report.num_admitted == 1

    host_ids = torch.tensor([HOST_IDS], dtype=torch.int32)
    output = torch.full((1, 2560), 99.0, dtype=torch.float16)
    intermediate = torch.full((10, 160), 99.0, dtype=torch.float16)
    result = method._apply_legacy_single_token_compact(
        layer, x, weights, host_ids, {"intermediate": intermediate}, 10, output
    )
    assert result is output and layer.host_route_calls == []

    # The same ten experts, read from a 10-expert bank by the operator directly.
    direct_out = torch.empty(1, 2560, dtype=torch.float16)
    direct_inter = torch.empty(10, 160, dtype=torch.float16)
    local_ids = torch.arange(10, dtype=torch.int32).reshape(1, 10)
    torch.ops.qpnserve.awq_moe_m1_out(
        direct_out, direct_inter, x, banks.w13, banks.s13, banks.w2, banks.s2, local_ids, weights
    )
    assert torch.equal(output, direct_out) and torch.equal(intermediate, direct_inter)

    ref = oracle_detail(x, banks.w13, banks.s13, banks.w2, banks.s2, local_ids, weights)
    ok, summary = out_within_contract(output, ref)
    assert ok, summary
    assert int(np.max(fp16_ulp_distance(intermediate, ref.intermediate))) <= 2
