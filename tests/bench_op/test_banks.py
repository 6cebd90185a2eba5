"""The benchmark's own banks and FP64 reference against the operator's reference module."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpnserve.benchop.banks import (
    LayerBanks,
    check_route_output,
    dequantize,
    floor_expected_sum,
    fp16_from_fp64,
    make_layer,
    reference_route,
    unpack_codes,
)
from qpnserve.benchop.contenders import derive_torch

reference = pytest.importorskip("qpnserve.kernels.reference")


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_bench_reference_matches_operator_oracle(fmt: str) -> None:
    banks = reference.random_banks(12, seed=3, fmt=fmt)
    x, ids, weights = reference.random_inputs(seed=4, num_experts=12)
    layer = LayerBanks(banks.w13, banks.s13, banks.w2, banks.s2, ids, weights, x)
    ours = reference_route(x, layer, ids, weights)
    out, h = reference.oracle_fp64(x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    assert torch.equal(ours.intermediate.to(torch.float16), h)
    assert torch.equal(ours.out.to(torch.float16), out)


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


def test_fp16_from_fp64_rounds_once() -> None:
    # 1 + 2^-11 + 2^-40 lies just above the FP16 midpoint between 1 and 1 + 2^-10; going
    # through FP32 first lands exactly on the midpoint and rounds down to even (1.0).
    value = torch.tensor([1 + 2.0**-11 + 2.0**-40], dtype=torch.float64)
    assert value.to(torch.float32).to(torch.float16).item() == 1.0
    assert fp16_from_fp64(value).item() == 1 + 2.0**-10


def test_check_accepts_the_reference_itself() -> None:
    gen = torch.Generator().manual_seed(2)
    layer = make_layer("4byte", gen, torch.device("cpu"), num_experts=12)
    x = layer.seed
    ref = reference_route(x, layer, layer.route_ids, layer.route_weights)
    result = check_route_output(ref.out.half(), ref, ref.intermediate.half())
    assert result.ok and result.intermediate_max_ulps == 0


def test_check_rejects_nan_output() -> None:
    gen = torch.Generator().manual_seed(2)
    layer = make_layer("4byte", gen, torch.device("cpu"), num_experts=12)
    ref = reference_route(layer.seed, layer, layer.route_ids, layer.route_weights)
    out = ref.out.half().clone()
    out[0, 5] = float("nan")
    assert not check_route_output(out, ref).ok


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


def test_check_tolerates_many_ulps_only_on_tiny_intermediate_values() -> None:
    gen = torch.Generator().manual_seed(2)
    layer = make_layer("4byte", gen, torch.device("cpu"), num_experts=12)
    ref = reference_route(layer.seed, layer, layer.route_ids, layer.route_weights)
    h = ref.intermediate.half().clone()
    flat = h.view(-1)
    small = int(ref.intermediate.abs().view(-1).argmin())
    big = int(ref.intermediate.abs().view(-1).argmax())
    flat.view(torch.int16)[small] += 12  # 12 ulps of the smallest |h|: cancellation noise
    assert check_route_output(ref.out.half(), ref, h).ok
    flat.view(torch.int16)[big] += 3  # 3 ulps of the largest |h|: a real error
    assert not check_route_output(ref.out.half(), ref, h).ok
