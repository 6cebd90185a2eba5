"""The executable form of contract sections 3 and 4: bank packer/unpacker and an FP64 oracle.

Independent of the operator (numpy, not the C++/CUDA code): tests compare the op against
``oracle_fp64``, and benchmarks build their banks with ``random_banks``.

Plain AWQ tensors, per expert (the packer's input):
  codes   (E, K, N) uint8 in 0..15   (W13: K=2560, N=320 in the prepared column order, i.e.
                                      column 2i = gate_i, 2i+1 = up_i;
                                      W2: K=160, N=2560)
  scales  (E, K/32, N) float16
  zeros   (E, K/32, N) uint8 in 0..15
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from qpnserve import geometry

if TYPE_CHECKING:
    import torch

Format = Literal["4byte", "3byte"]
FORMATS: tuple[Format, ...] = ("4byte", "3byte")

HIDDEN = geometry.HIDDEN
INTER = geometry.INTERMEDIATE
N13 = geometry.W13_N
ROUTES = geometry.TOP_K
GROUP = geometry.GROUP
# Row offset j of an 8-row block sits in nibble NIBBLE_OF_ROW[j] of its word (contract section 3).
NIBBLE_OF_ROW = (0, 4, 1, 5, 2, 6, 3, 7)


def _np(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _torch(a: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def pack_codes(codes: Any) -> np.ndarray:
    """(E, K, N) codes 0..15 -> (E, K, N/8) int32 tiled words (contract section 3)."""
    c = _np(codes).astype(np.uint32)
    e, k, n = c.shape
    if k % GROUP or n % 32 or c.max(initial=0) > 15:
        raise ValueError("codes must be (E, K, N) with K % 32 == 0, N % 32 == 0, values 0..15")
    # (E, K/8, 8, N/32, 32) [e, k8, j, t, c] -> words [e, t, k8, c]
    blocks = c.reshape(e, k // 8, 8, n // 32, 32)
    words = np.zeros((e, n // 32, k // 8, 32), dtype=np.uint32)
    for j, nibble in enumerate(NIBBLE_OF_ROW):
        words |= blocks[:, :, j, :, :].transpose(0, 2, 1, 3) << np.uint32(4 * nibble)
    return words.reshape(e, k, n // 8).view(np.int32)


def unpack_codes(words: Any, k: int, n: int) -> np.ndarray:
    """(E, K, N/8) int32 tiled words -> (E, K, N) uint8 codes."""
    w = _np(words).view(np.uint32).reshape(-1, n // 32, k // 8, 32)
    e = w.shape[0]
    rows = np.empty((e, k // 8, 8, n // 32, 32), dtype=np.uint8)
    for j, nibble in enumerate(NIBBLE_OF_ROW):
        rows[:, :, j, :, :] = ((w >> np.uint32(4 * nibble)) & 0xF).transpose(0, 2, 1, 3)
    return rows.reshape(e, k, n)


def bias_fp16(scales: Any, zeros: Any) -> np.ndarray:
    """fp16(-z * s): the product is exact in FP32 (4 x 11 bits), so this is one FP16 rounding."""
    s = _np(scales).astype(np.float16).astype(np.float32)
    z = _np(zeros).astype(np.float32)
    with np.errstate(over="ignore"):  # a huge scale overflows to inf in FP16, as on the GPU
        return (-z * s).astype(np.float16)


def pack_meta(scales: Any, zeros: Any, fmt: Format) -> np.ndarray:
    """(E, G, N) fp16 scales and 0..15 zero points -> 4-byte int32 or 3-byte uint8 records."""
    s = _np(scales).astype(np.float16)
    z = _np(zeros).astype(np.uint8)
    if z.max(initial=0) > 15:
        raise ValueError("zero points must be 0..15")
    s_bits = s.view(np.uint16)
    if fmt == "4byte":
        b_bits = bias_fp16(s, z).view(np.uint16)
        return (s_bits.astype(np.uint32) | (b_bits.astype(np.uint32) << 16)).view(np.int32)
    if fmt == "3byte":
        rec = np.empty((*s.shape, 3), dtype=np.uint8)
        rec[..., 0] = s_bits & 0xFF
        rec[..., 1] = s_bits >> 8
        rec[..., 2] = z
        return rec
    raise ValueError(f"unknown metadata format {fmt!r}")


def meta_format(meta: Any) -> Format:
    """The format of a metadata bank, decided by its dtype (int32 4-byte, uint8 3-byte)."""
    dtype = str(getattr(meta, "dtype", ""))
    if dtype.endswith("int32"):
        return "4byte"
    if dtype.endswith("uint8"):
        return "3byte"
    raise ValueError(f"metadata must be int32 or uint8, got {dtype}")


def unpack_meta(meta: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Records -> (scales fp16, biases fp16, zeros uint8 or None for the 4-byte form)."""
    m = _np(meta)
    if meta_format(meta) == "4byte":
        bits = m.view(np.uint32)
        scales = (bits & 0xFFFF).astype(np.uint16).view(np.float16)
        biases = (bits >> 16).astype(np.uint16).view(np.float16)
        return scales, biases, None
    scales = (m[..., 0].astype(np.uint16) | (m[..., 1].astype(np.uint16) << 8)).view(np.float16)
    zeros = m[..., 2].copy()
    return scales, bias_fp16(scales, zeros), zeros


def zeros_from_bias(scales: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """The smallest z in 0..15 with fp16(-z * s) == b, bitwise (4-byte form); ValueError if none."""
    z_out = np.full(scales.shape, 255, dtype=np.uint8)
    b_bits = biases.view(np.uint16)
    for z in range(15, -1, -1):
        match = bias_fp16(scales, np.full(scales.shape, z, np.uint8)).view(np.uint16) == b_bits
        z_out[match] = z
    if (z_out == 255).any():
        raise ValueError("a 4-byte bias is not fp16(-z * s) for any zero point 0..15")
    return z_out


@dataclass(frozen=True)
class PlainBanks:
    """Plain AWQ tensors of one layer (numpy), as ``pack_banks`` takes them."""

    codes_w13: np.ndarray
    scales_w13: np.ndarray
    zeros_w13: np.ndarray
    codes_w2: np.ndarray
    scales_w2: np.ndarray
    zeros_w2: np.ndarray
    fmt: Format


def pack_banks(
    codes_w13: Any,
    scales_w13: Any,
    zeros_w13: Any,
    codes_w2: Any,
    scales_w2: Any,
    zeros_w2: Any,
    fmt: Format = "4byte",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain AWQ tensors -> the prepared banks (w13, s13, w2, s2) of contract section 3 (CPU)."""
    return (
        _torch(pack_codes(codes_w13)),
        _torch(pack_meta(scales_w13, zeros_w13, fmt)),
        _torch(pack_codes(codes_w2)),
        _torch(pack_meta(scales_w2, zeros_w2, fmt)),
    )


def unpack_banks(w13: Any, s13: Any, w2: Any, s2: Any) -> PlainBanks:
    """Prepared banks -> plain AWQ tensors (the 4-byte form recovers z from the stored bias)."""
    fmt = meta_format(s13)
    if meta_format(s2) != fmt:
        raise ValueError("s13 and s2 must use the same metadata format")
    k13, n13 = _np(w13).shape[1], _np(w13).shape[2] * 8
    k2, n2 = _np(w2).shape[1], _np(w2).shape[2] * 8
    sc13, b13, z13 = unpack_meta(s13)
    sc2, b2, z2 = unpack_meta(s2)
    return PlainBanks(
        codes_w13=unpack_codes(w13, k13, n13),
        scales_w13=sc13,
        zeros_w13=z13 if z13 is not None else zeros_from_bias(sc13, b13),
        codes_w2=unpack_codes(w2, k2, n2),
        scales_w2=sc2,
        zeros_w2=z2 if z2 is not None else zeros_from_bias(sc2, b2),
        fmt=fmt,
    )


def dequantize_expert(words: np.ndarray, meta: np.ndarray, k: int, n: int) -> np.ndarray:
    """One expert's (K, N) weights as float64 values of fp16(q * s + b), one rounding.

    q * s + b is exact in float64 (at most 43 significant bits), and numpy rounds float64 to
    float16 directly (round to nearest even), so this is the FP16 fused multiply-add.
    """
    codes = unpack_codes(words[None], k, n)[0].astype(np.float64)
    scales, biases, _ = unpack_meta(meta)
    s = np.repeat(scales.astype(np.float64), GROUP, axis=0)
    b = np.repeat(biases.astype(np.float64), GROUP, axis=0)
    return (codes * s + b).astype(np.float16).astype(np.float64)


@dataclass(frozen=True)
class OracleResult:
    out: np.ndarray  # (1, 2560) float16
    intermediate: np.ndarray  # (10, 160) float16
    # (10, 160) bool: False where FP32 vs FP64 evaluation of silu may round to a different FP16
    # (the FP64 silu lies within 1e-6 relative of an FP16 rounding tie). Elsewhere an op whose
    # gate/up sums are exact (one-hot x) must match the oracle bit for bit.
    silu_unambiguous: np.ndarray
    out_abs_ref: np.ndarray  # (1, 2560) float64: the FP64 combine before its FP16 rounding
    # (10, 160) float64 each: exact gate/up sums and their sums of |x_k * w_k| (conditioning)
    gate: np.ndarray
    up: np.ndarray
    gate_abs: np.ndarray
    up_abs: np.ndarray


def _near_fp16_tie(v: np.ndarray, rel: float = 1e-6) -> np.ndarray:
    """True where v is within rel * |v| of a point halfway between two FP16 values."""
    lo = v.astype(np.float16)
    lo64 = lo.astype(np.float64)
    step_up = np.nextafter(lo, np.float16(np.inf)).astype(np.float64)
    step_dn = np.nextafter(lo, np.float16(-np.inf)).astype(np.float64)
    tie_up = (lo64 + step_up) / 2
    tie_dn = (lo64 + step_dn) / 2
    tol = rel * np.abs(v) + 2.0**-40
    with np.errstate(invalid="ignore"):
        return (np.abs(v - tie_up) <= tol) | (np.abs(v - tie_dn) <= tol)


def oracle_detail(
    x: Any, w13: Any, s13: Any, w2: Any, s2: Any, ids: Any, weights: Any
) -> OracleResult:
    """FP64 evaluation of the op with the contract's FP16 rounding stages (section 4)."""
    xs = _np(x).astype(np.float64).reshape(HIDDEN)
    w13n, s13n, w2n, s2n = _np(w13), _np(s13), _np(w2), _np(s2)
    ids_n = _np(ids).astype(np.int64).reshape(ROUTES)
    r_w = _np(weights).astype(np.float64).reshape(ROUTES)
    experts = w13n.shape[0]
    inter = np.zeros((ROUTES, INTER), dtype=np.float16)
    unambiguous = np.ones((ROUTES, INTER), dtype=bool)
    acc = np.zeros(HIDDEN, dtype=np.float64)
    sums = {name: np.zeros((ROUTES, INTER)) for name in ("gate", "up", "gate_abs", "up_abs")}
    for r in range(ROUTES):
        e = int(ids_n[r])
        if not 0 <= e < experts:
            continue  # contributes exactly zero; intermediate row stays zero
        w_up = dequantize_expert(w13n[e], s13n[e], HIDDEN, N13)
        exact = xs @ w_up
        magnitude = np.abs(xs) @ np.abs(w_up)
        sums["gate"][r], sums["up"][r] = exact[0::2], exact[1::2]
        sums["gate_abs"][r], sums["up_abs"][r] = magnitude[0::2], magnitude[1::2]
        gate_up = exact.astype(np.float16).astype(np.float64)
        gate, up = gate_up[0::2], gate_up[1::2]
        with np.errstate(over="ignore"):
            silu = gate / (1.0 + np.exp(-gate))
        unambiguous[r] = ~_near_fp16_tie(silu)
        silu16 = silu.astype(np.float16).astype(np.float64)
        h = (silu16 * up).astype(np.float16)
        inter[r] = h
        w_down = dequantize_expert(w2n[e], s2n[e], INTER, HIDDEN)
        y = (h.astype(np.float64) @ w_down).astype(np.float16).astype(np.float64)
        acc += r_w[r] * y
    return OracleResult(
        out=acc.astype(np.float16).reshape(1, HIDDEN),
        intermediate=inter,
        silu_unambiguous=unambiguous,
        out_abs_ref=acc.reshape(1, HIDDEN),
        **sums,
    )


def oracle_fp64(
    x: Any, w13: Any, s13: Any, w2: Any, s2: Any, ids: Any, weights: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (1, 2560) fp16, intermediate (10, 160) fp16) of the FP64 oracle, as CPU tensors."""
    result = oracle_detail(x, w13, s13, w2, s2, ids, weights)
    return _torch(result.out), _torch(result.intermediate)


def fp16_ulp_distance(a: Any, b: Any) -> np.ndarray:
    """Elementwise distance in FP16 units in the last place (monotone integer order)."""
    ai = _np(a).astype(np.float16).view(np.int16).astype(np.int32)
    bi = _np(b).astype(np.float16).view(np.int16).astype(np.int32)
    # Map sign-magnitude to a monotone integer line.
    ai = np.where(ai < 0, -32768 - ai, ai)
    bi = np.where(bi < 0, -32768 - bi, bi)
    return np.abs(ai - bi)


def _fp16_ulp(v: np.ndarray) -> np.ndarray:
    """Spacing of FP16 values at v (float64), computed away from zero."""
    h = np.abs(v).astype(np.float16)
    return np.nextafter(h, np.float16(np.inf)).astype(np.float64) - h.astype(np.float64)


# Contract section 4: the intermediate equals the oracle on at least this share of elements.
MIN_EQUAL_FRACTION = 0.98


def intermediate_within_contract(
    intermediate: Any, ref: OracleResult, min_equal_fraction: float = MIN_EQUAL_FRACTION
) -> tuple[bool, str]:
    """Contract section 4's bound for intermediate under random x, made precise.

    Equal on at least ``min_equal_fraction`` of the elements, and each element within 2 FP16
    ulps of the oracle or within what the contract's "a rounding flip of gate and one of up can
    compound" allows: one FP16 ulp of gate and of up carried through SwiGLU (silu' can amplify
    it several fold), plus one ulp each of the silu and h roundings. Where a gate or up sum
    cancels (|sum| < 2^-8 of the sum of |x_k * w_k|), FP32 itself cannot promise FP16 ulps, so
    the rigorous FP32 accumulation bound (2^-24 * K * sum|x w|) is carried through SwiGLU too.
    """
    got = _np(intermediate).astype(np.float16).reshape(ROUTES, INTER)
    ulps = fp16_ulp_distance(got, ref.intermediate)
    g, u = ref.gate, ref.up
    with np.errstate(over="ignore", invalid="ignore"):
        sig = 1.0 / (1.0 + np.exp(-g))
        silu = g * sig
        dsilu = sig * (1.0 + g * (1.0 - sig))
    d_gate = _fp16_ulp(g)
    d_up = _fp16_ulp(u)
    ill = (np.abs(g) < 2.0**-8 * ref.gate_abs) | (np.abs(u) < 2.0**-8 * ref.up_abs)
    eps = 2.0**-24 * HIDDEN
    d_gate = np.where(ill, d_gate + eps * ref.gate_abs, d_gate)
    d_up = np.where(ill, d_up + eps * ref.up_abs, d_up)
    h_ref = ref.intermediate.astype(np.float64)
    bound = (
        np.abs(dsilu * u) * d_gate
        + np.abs(silu) * d_up
        + np.abs(u) * _fp16_ulp(silu)
        + _fp16_ulp(h_ref)
    ) * 1.01
    diff = np.abs(got.astype(np.float64) - h_ref)
    ok_elem = (ulps <= 2) | (diff <= bound)
    equal_fraction = float((ulps == 0).mean())
    ok = bool(ok_elem.all() and equal_fraction >= min_equal_fraction and np.isfinite(got).all())
    summary = (
        f"max ulps {int(ulps.max())} ({int((ulps > 2).sum())} beyond 2, all within the "
        f"propagated flip bound: {bool(ok_elem.all())}), equal {equal_fraction:.4f}"
    )
    return ok, summary


def out_within_contract(out: Any, ref: OracleResult) -> tuple[bool, str]:
    """Contract section 4's bounds for out under random x; returns (ok, a one-line summary)."""
    o = _np(out).astype(np.float64).reshape(-1)
    r = ref.out.astype(np.float64).reshape(-1)
    diff = o - r
    max_ok = np.max(np.abs(diff)) <= 2e-3 * np.max(np.abs(r)) + 2.0**-24
    l2_ok = np.linalg.norm(diff) <= 2e-3 * np.linalg.norm(r) + np.sqrt(HIDDEN) * 2.0**-24
    finite = bool(np.isfinite(o).all())
    summary = (
        f"max|diff|={np.max(np.abs(diff)):.3g} (max|ref|={np.max(np.abs(r)):.3g}), "
        f"||diff||={np.linalg.norm(diff):.3g} (||ref||={np.linalg.norm(r):.3g})"
    )
    return bool(max_ok and l2_ok and finite), summary


# ---------------------------------------------------------------------------------------------
# Random banks and inputs for tests and benchmarks (torch; any device).


@dataclass(frozen=True)
class Banks:
    """One layer's prepared banks (contract section 3), on one device."""

    w13: torch.Tensor  # (E, 2560, 40) int32
    s13: torch.Tensor  # (E, 80, 320) int32 or (E, 80, 320, 3) uint8
    w2: torch.Tensor  # (E, 160, 320) int32
    s2: torch.Tensor  # (E, 5, 2560) int32 or (E, 5, 2560, 3) uint8
    fmt: Format

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])


def _random_meta(
    shape: tuple[int, ...], fmt: Format, gen: torch.Generator, adversarial: bool, device: Any
) -> torch.Tensor:
    import torch

    # Scales around 2^-7 keep |w| ~ 0.1, so sums over K=2560 stay far inside FP16 range.
    log2 = torch.empty(shape, dtype=torch.float32).uniform_(-8.0, -6.0, generator=gen)
    scales = torch.exp2(log2)
    zeros = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen)
    if adversarial:
        pick = torch.rand(shape, generator=gen)
        scales = torch.where(pick < 0.15, -scales, scales)  # negative scales
        scales = torch.where((pick >= 0.15) & (pick < 0.25), scales * 2.0**-14, scales)  # tiny
        scales = torch.where((pick >= 0.25) & (pick < 0.27), torch.zeros_like(scales), scales)
        zpick = torch.rand(shape, generator=gen)
        zeros = torch.where(zpick < 0.2, torch.zeros_like(zeros), zeros)
        zeros = torch.where(zpick > 0.8, torch.full_like(zeros, 15), zeros)
    s16 = scales.to(torch.float16)
    if fmt == "4byte":
        bias = (-zeros.to(torch.float32) * s16.to(torch.float32)).to(torch.float16)
        s_bits = s16.view(torch.int16).to(torch.int32) & 0xFFFF
        b_bits = bias.view(torch.int16).to(torch.int32) & 0xFFFF
        meta = s_bits | (b_bits << 16)
    elif fmt == "3byte":
        s_bits = s16.view(torch.int16).to(torch.int32) & 0xFFFF
        meta = torch.stack(
            [(s_bits & 0xFF).to(torch.uint8), (s_bits >> 8).to(torch.uint8), zeros], dim=-1
        )
    else:
        raise ValueError(f"unknown metadata format {fmt!r}")
    return meta.contiguous().to(device)


def random_banks(
    num_experts: int,
    seed: int,
    fmt: Format = "4byte",
    device: Any = "cpu",
    adversarial: bool = False,
) -> Banks:
    """Random prepared banks with the contract's per-expert shapes and E = num_experts.

    Every int32 word is a valid set of 8 codes, so code words are uniform random bits. With
    adversarial=True the metadata mixes in negative, tiny (subnormal-range) and zero scales, and
    zero points 0 and 15. Generated on the CPU (seeded), then moved to ``device``.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    e = num_experts

    def words(*shape: int) -> torch.Tensor:
        return torch.randint(-(2**31), 2**31, shape, dtype=torch.int32, generator=gen).to(device)

    return Banks(
        w13=words(e, HIDDEN, N13 // 8),
        s13=_random_meta((e, HIDDEN // GROUP, N13), fmt, gen, adversarial, device),
        w2=words(e, INTER, HIDDEN // 8),
        s2=_random_meta((e, INTER // GROUP, HIDDEN), fmt, gen, adversarial, device),
        fmt=fmt,
    )


def random_inputs(
    seed: int, num_experts: int, device: Any = "cpu", distinct: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x (1, 2560) fp16 ~ N(0, 1), ids (1, 10) int32 in [0, E), weights (1, 10) fp32 > 0)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, HIDDEN, generator=gen).to(torch.float16)
    if distinct and num_experts >= ROUTES:
        ids = torch.randperm(num_experts, generator=gen)[:ROUTES]
    else:
        ids = torch.randint(0, num_experts, (ROUTES,), generator=gen)
    weights = torch.softmax(torch.randn(ROUTES, generator=gen), dim=0)
    return (
        x.to(device),
        ids.to(torch.int32).reshape(1, ROUTES).to(device),
        weights.to(torch.float32).reshape(1, ROUTES).to(device),
    )
