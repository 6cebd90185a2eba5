"""The FP64 reference decoded from the export: AWQ nibble order, the dequantization rule, the TP
share, and refusals of samples that exercise nothing. Expected values are literals from the
contract, or a dense computation built from the fixture writer's side (its own packer)."""

from __future__ import annotations

import numpy as np

from qpnserve.fixtures.checkpoint import awq_pack
from qpnserve.verify import prepare
from qpnserve.verify.export import ExpertExport, ProjExport
from qpnserve.verify.reference import awq_unpack, dequantize, reference
from qpnserve.verify.samples import Sample, sample

# One word with nibble i = i: AWQ GEMM order puts nibble i at column [0, 2, 4, 6, 1, 3, 5, 7][i],
# so the 8 columns read [0, 4, 1, 5, 2, 6, 3, 7].
WORD = np.array([[0x76543210]], dtype=np.uint32).view(np.int32)
COLUMNS = [0, 4, 1, 5, 2, 6, 3, 7]


def test_awq_unpack_follows_the_exports_nibble_order() -> None:
    assert awq_unpack(WORD).tolist() == [COLUMNS]


def test_bank_preparation_undoes_the_same_nibble_order() -> None:
    assert prepare.awq_codes(WORD).tolist() == [COLUMNS]


def test_fixture_packer_and_reference_unpacker_round_trip() -> None:
    codes = np.random.default_rng(0).integers(0, 16, size=(4, 64))
    assert np.array_equal(awq_unpack(awq_pack(codes)), codes)


def _proj(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> ProjExport:
    return ProjExport(awq_pack(codes), awq_pack(zeros), scales.astype(np.float16))


def test_dequantize_is_one_fp16_rounding_of_q_s_plus_fp16_bias() -> None:
    # s = fp16 bits 0x224C (0.0123), q = 1, z = 7: fp16(q*s + fp16(-z*s)) has bits 0xACB8,
    # while fp16((q - z) * s), which the contract forbids, has bits 0xACB9.
    scale = np.array([[0x224C] * 8], dtype=np.uint16).view(np.float16)
    codes = np.ones((32, 8), dtype=np.int64)
    zeros = np.full((1, 8), 7)
    w = dequantize(_proj(codes, zeros, scale))
    assert w.astype(np.float16).view(np.uint16)[0, 0] == 0xACB8


def _dense(rng: np.random.Generator, k: int, n: int) -> tuple[ProjExport, np.ndarray]:
    codes = rng.integers(0, 16, size=(k, n))
    zeros = rng.integers(0, 16, size=(k // 32, n))
    scales = np.exp(rng.uniform(np.log(1e-3), np.log(1e-2), size=(k // 32, n))).astype(np.float16)
    s = np.repeat(scales.astype(np.float64), 32, axis=0)
    b = np.repeat((-zeros * scales.astype(np.float64)).astype(np.float16).astype(np.float64), 32, 0)
    return _proj(codes, zeros, scales), (codes * s + b).astype(np.float16).astype(np.float64)


def test_reference_takes_each_ranks_share_of_the_intermediate() -> None:
    rng = np.random.default_rng(5)
    gate, wg = _dense(rng, 2560, 640)
    up, wu = _dense(rng, 2560, 640)
    down, wd = _dense(rng, 640, 2560)
    expert = ExpertExport(gate, up, down)
    x = rng.standard_normal(2560).astype(np.float16)
    one = Sample(0, 0, x, np.full(10, 3, dtype=np.int32), np.full(10, 0.1, dtype=np.float32))
    refs = reference(one, {3: expert})
    for rank in (0, 3):
        cols = slice(160 * rank, 160 * rank + 160)
        g = (x.astype(np.float64) @ wg[:, cols]).astype(np.float16).astype(np.float64)
        u = (x.astype(np.float64) @ wu[:, cols]).astype(np.float16).astype(np.float64)
        silu = (g / (1 + np.exp(-g))).astype(np.float16).astype(np.float64)
        h = (silu * u).astype(np.float16).astype(np.float64)
        y = (h @ wd[cols, :]).astype(np.float16).astype(np.float64)
        assert refs[rank].refused is None
        assert np.array_equal(refs[rank].h[0], h)
        # ten routes of the same expert, each weighted 0.1 (as fp32)
        want = (10 * np.float64(np.float32(0.1)) * y).astype(np.float16).astype(np.float64)
        assert np.allclose(refs[rank].out, want, rtol=2e-3, atol=0)


def _hole_expert() -> ExpertExport:
    zero = ProjExport(
        np.zeros((2560, 80), np.int32),
        np.zeros((80, 80), np.int32),
        np.zeros((80, 640), np.float16),
    )
    down = ProjExport(
        np.zeros((640, 320), np.int32),
        np.zeros((20, 320), np.int32),
        np.zeros((20, 2560), np.float16),
    )
    return ExpertExport(zero, zero, down)


def test_reference_refuses_all_zero_weights_naming_the_expert() -> None:
    s = sample(0, 0)
    refs = reference(s, {int(e): _hole_expert() for e in s.ids}, ranks=[2])
    assert refs[0].refused is not None
    assert f"expert {int(s.ids[0])}" in refs[0].refused and "all zero" in refs[0].refused


def test_reference_refuses_all_zero_activations() -> None:
    s = sample(0, 0)
    blank = Sample(0, 0, np.zeros(2560, np.float16), s.ids, s.weights)
    refs = reference(blank, {}, ranks=[0])
    assert refs[0].refused == "the activation x is all zero"


def test_samples_have_realistic_scale_and_router_weights() -> None:
    s = sample(3, 1)
    assert 0.8 < float(np.std(s.x.astype(np.float64))) < 2.0
    assert len(set(s.ids.tolist())) == 10 and s.ids.min() >= 0 and s.ids.max() < 512
    assert abs(float(s.weights.sum()) - 1.0) < 1e-6 and s.weights.min() > 0
