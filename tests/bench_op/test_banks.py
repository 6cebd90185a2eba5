"""The benchmark's banks, their PyTorch decoding, and the FP64 check it applies per layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpnserve.benchop.banks import (
    dequantize,
    floor_expected_sum,
    make_layer,
    unpack_codes,
)
from qpnserve.benchop.checks import _check_layer
from qpnserve.benchop.contenders import LayerState, derive_torch
from qpnserve.kernels import reference  # a broken module fails these tests, never skips them


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_bench_banks_decode_like_operator_unpacker(fmt: str) -> None:
    gen = torch.Generator().manual_seed(1)
    layer = make_layer(fmt, gen, torch.device("cpu"), num_experts=12)
    plain = reference.unpack_banks(layer.w13, layer.s13, layer.w2, layer.s2)
    codes = unpack_codes(layer.w2, 160, 2560).numpy()
    assert np.array_equal(codes, plain.codes_w2)
    want = reference.dequantize_expert(layer.w13[1].numpy(), layer.s13[1].numpy(), 2560, 320)
    got = dequantize(layer.w13[1:2], layer.s13[1:2], 2560, 320)[0]
    assert np.array_equal(got.to(torch.float64).numpy(), want)


def test_floor_expected_sum_wraps_at_32_bits() -> None:
    gen = torch.Generator().manual_seed(5)
    layer = make_layer("3byte", gen, torch.device("cpu"), num_experts=12)
    total = floor_expected_sum(layer, layer.route_ids)
    assert 0 <= total < 2**32
    layer.w2[int(layer.route_ids[0, 0])].view(-1)[0] += 1
    assert floor_expected_sum(layer, layer.route_ids) == (total + 1) % 2**32


def test_floor_expected_sum_w13_only_leaves_w2_out() -> None:
    gen = torch.Generator().manual_seed(6)
    layer = make_layer("4byte", gen, torch.device("cpu"), num_experts=12)
    w13_sum = floor_expected_sum(layer, layer.route_ids, w13_only=True)
    expert = int(layer.route_ids[0, 0])
    layer.w2[expert].view(-1)[0] += 1
    layer.s2[expert].view(-1)[0] += 1
    assert floor_expected_sum(layer, layer.route_ids, w13_only=True) == w13_sum
    layer.s13[expert].view(-1)[0] += 1
    assert floor_expected_sum(layer, layer.route_ids, w13_only=True) == (w13_sum + 1) % 2**32


def test_derive_mixes_clamped_previous_output_into_seed() -> None:
    seed = torch.full((1, 2560), 1.0, dtype=torch.float16)
    prev = torch.full((1, 2560), 100.0, dtype=torch.float16)
    x, ids, w = torch.empty_like(seed), torch.empty(1, 10, dtype=torch.int32), torch.empty(1, 10)
    src_ids, src_w = torch.arange(10, dtype=torch.int32).view(1, 10), torch.rand(1, 10)
    derive_torch(x, ids, w, prev, seed, src_ids, src_w)
    assert torch.all(x == 2.0)  # 1 + 0.125 * clamp(100, -8, 8)
    assert torch.equal(ids, src_ids) and torch.equal(w, src_w)


def _layer_state(fmt: str, seed: int) -> tuple[LayerState, object]:
    gen = torch.Generator().manual_seed(seed)
    layer = make_layer(fmt, gen, torch.device("cpu"), num_experts=12)
    x, ids, w = layer.seed, layer.route_ids, layer.route_weights
    want = reference.oracle_detail(x, layer.w13, layer.s13, layer.w2, layer.s2, ids, w)
    st = LayerState(
        banks=layer,
        x=x.clone(),
        ids=ids.clone(),
        weights=w.clone(),
        out=torch.from_numpy(want.out.copy()),
        intermediate=torch.from_numpy(want.intermediate.copy()),
        sink=None,
    )
    return st, want


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_layer_check_accepts_the_oracle_itself(fmt: str) -> None:
    st, _ = _layer_state(fmt, seed=2)
    ok, why, ratio = _check_layer(st, with_h=True)
    assert ok, why
    assert ratio == 0.0


def test_layer_check_rejects_nan_output() -> None:
    st, _ = _layer_state("4byte", seed=2)
    st.out[0, 5] = float("nan")
    assert not _check_layer(st, with_h=False)[0]


def test_layer_check_rejects_a_wrong_intermediate_element() -> None:
    st, want = _layer_state("4byte", seed=2)
    big = int(abs(want.intermediate.astype("float64")).reshape(-1).argmax())
    st.intermediate.view(-1).view(torch.int16)[big] += 40  # far past any rounding flip
    assert _check_layer(st, with_h=False)[0]  # out alone still passes
    assert not _check_layer(st, with_h=True)[0]
