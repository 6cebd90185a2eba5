"""The packer, unpacker and oracle of qpnserve.kernels.reference against contract section 3."""

from __future__ import annotations

import numpy as np
import pytest

from qpnserve.kernels import reference as ref


def _plain(seed: int, experts: int = 3, k: int = 64, n: int = 64):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (experts, k, n), dtype=np.uint8)
    scales = (rng.uniform(0.5, 2.0, (experts, k // 32, n)) * 2.0**-7).astype(np.float16)
    scales[0, 0, :4] = np.array([-0.01, 2.0**-20, 0.0, 65504.0], dtype=np.float16)
    zeros = rng.integers(0, 16, (experts, k // 32, n), dtype=np.uint8)
    zeros[0, 0, 4:8] = [0, 15, 0, 15]
    return codes, scales, zeros


def test_packed_word_holds_row_j_in_contract_nibble() -> None:
    k, n = 32, 64
    codes = np.zeros((1, k, n), dtype=np.uint8)
    # column n = 37 (tile 1, lane 5), rows 8..15 (k8 = 1): codes 1..8 for j = 0..7
    codes[0, 8:16, 37] = np.arange(1, 9)
    words = ref.pack_codes(codes).reshape(-1).view(np.uint32)
    t, c, k8 = 1, 5, 1
    word = int(words[(t * (k // 8) + k8) * 32 + c])
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble p holds row j = order[p]
    for p in range(8):
        assert (word >> (4 * p)) & 0xF == order[p] + 1
    assert np.count_nonzero(words) == 1


@pytest.mark.parametrize("fmt", ref.FORMATS)
def test_pack_unpack_round_trip_is_exact(fmt: ref.Format) -> None:
    codes13, scales13, zeros13 = _plain(1, k=64, n=64)
    codes2, scales2, zeros2 = _plain(2, k=32, n=96)
    banks = ref.pack_banks(codes13, scales13, zeros13, codes2, scales2, zeros2, fmt=fmt)
    plain = ref.unpack_banks(*banks)
    assert plain.fmt == fmt
    assert np.array_equal(plain.codes_w13, codes13)
    assert np.array_equal(plain.codes_w2, codes2)
    assert np.array_equal(plain.scales_w13.view(np.uint16), scales13.view(np.uint16))
    again = ref.pack_banks(
        plain.codes_w13,
        plain.scales_w13,
        plain.zeros_w13,
        plain.codes_w2,
        plain.scales_w2,
        plain.zeros_w2,
        fmt=fmt,
    )
    for a, b in zip(banks, again, strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    if fmt == "3byte":
        assert np.array_equal(plain.zeros_w13, zeros13)


def test_four_byte_record_is_scale_low_and_fp16_bias_high() -> None:
    scales = np.array([[[0.01, -0.25, 2.0**-20]]], dtype=np.float16)
    zeros = np.array([[[15, 3, 7]]], dtype=np.uint8)
    rec = ref.pack_meta(scales, zeros, "4byte").view(np.uint32).reshape(-1)
    for i in range(3):
        s = scales.reshape(-1)[i]
        expected_bias = np.float16(-float(zeros.reshape(-1)[i]) * float(s))
        assert rec[i] & 0xFFFF == s.view(np.uint16)
        assert rec[i] >> 16 == expected_bias.view(np.uint16)


def test_three_byte_record_is_scale_bytes_then_zero_point() -> None:
    scales = np.array([[[0.01]]], dtype=np.float16)
    rec = ref.pack_meta(scales, np.array([[[9]]], dtype=np.uint8), "3byte").reshape(-1)
    bits = int(scales.view(np.uint16)[0, 0, 0])
    assert list(rec) == [bits & 0xFF, bits >> 8, 9]


def test_dequantize_is_one_fp16_rounding_of_q_times_s_plus_b() -> None:
    # s * q + b needs more than FP16 precision; (q - z) * s rounds differently for some values.
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (1, 32, 32), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.02, (1, 1, 32)).astype(np.float16)
    zeros = rng.integers(0, 16, (1, 1, 32), dtype=np.uint8)
    words = ref.pack_codes(codes)[0]
    meta = ref.pack_meta(scales, zeros, "4byte")[0]
    got = ref.dequantize_expert(words, meta, 32, 32)
    b = ref.bias_fp16(scales, zeros)[0, 0].astype(np.float64)
    s = scales[0, 0].astype(np.float64)
    want = (codes[0] * s + b).astype(np.float16).astype(np.float64)
    assert np.array_equal(got, want)
    other_rule = ((codes[0].astype(np.float64) - zeros[0, 0]) * s).astype(np.float16)
    assert not np.array_equal(got, other_rule.astype(np.float64))


def test_random_banks_have_contract_shapes_and_dtypes() -> None:
    four = ref.random_banks(2, seed=0, fmt="4byte")
    three = ref.random_banks(2, seed=0, fmt="3byte")
    assert tuple(four.w13.shape) == (2, 2560, 40) and str(four.w13.dtype) == "torch.int32"
    assert tuple(four.s13.shape) == (2, 80, 320) and str(four.s13.dtype) == "torch.int32"
    assert tuple(four.w2.shape) == (2, 160, 320)
    assert tuple(four.s2.shape) == (2, 5, 2560)
    assert tuple(three.s13.shape) == (2, 80, 320, 3) and str(three.s13.dtype) == "torch.uint8"
    assert tuple(three.s2.shape) == (2, 5, 2560, 3)
    # Same seed: the 3-byte records rebuild exactly the 4-byte biases.
    s4, b4, _ = ref.unpack_meta(four.s13)
    s3, b3, _ = ref.unpack_meta(three.s13)
    assert np.array_equal(s4.view(np.uint16), s3.view(np.uint16))
    assert np.array_equal(b4.view(np.uint16), b3.view(np.uint16))


def test_intermediate_bound_rejects_a_corrupted_element() -> None:
    banks = ref.random_banks(10, seed=3)
    x, ids, weights = ref.random_inputs(3, 10)
    oracle = ref.oracle_detail(x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    assert ref.intermediate_within_contract(oracle.intermediate, oracle)[0]
    bad = oracle.intermediate.copy()
    r, i = np.unravel_index(np.argmax(np.abs(bad.astype(np.float64))), bad.shape)
    bad[r, i] = np.float16(float(bad[r, i]) * 1.01)
    assert not ref.intermediate_within_contract(bad, oracle)[0]
    out_bad = oracle.out.copy()
    out_bad[0, 7] = np.float16(float(out_bad[0, 7]) + 0.05 * float(np.abs(oracle.out).max()))
    assert not ref.out_within_contract(out_bad, oracle)[0]
    assert ref.out_within_contract(oracle.out, oracle)[0]
