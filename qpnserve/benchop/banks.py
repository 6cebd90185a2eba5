"""Random TP4-shaped prepared banks (contract section 3) and their decoding on the device.

The banks are generated directly in packed form on the target device (random words are valid
codes; metadata is built from random scales and zero points with the FP16 bias rule), because
packing 48 layers x 512 experts through a CPU packer would take minutes. The decoding here is
the plain PyTorch route's (a contender); the FP64 oracle and the acceptance bounds are
`qpnserve.kernels.reference`'s, which `benchop.checks` applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qpnserve.benchop.route_bytes import MetaFormat
from qpnserve.geometry import GROUP, HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K, W13_N

# Row offset j of the 8 codes in a word sits in nibble ORDER.index(j) (contract section 3).
_SHIFT_OF_ROW = [4 * [0, 2, 4, 6, 1, 3, 5, 7].index(j) for j in range(8)]


@dataclass
class LayerBanks:
    """One layer's banks, its fixed route and its seed input.

    w13 (E, 2560, 40) int32; s13 (E, 80, 320) int32 or (E, 80, 320, 3) uint8;
    w2 (E, 160, 320) int32; s2 (E, 5, 2560) int32 or (E, 5, 2560, 3) uint8;
    route_ids (1, 10) int32, distinct, in [0, E); route_weights (1, 10) fp32;
    seed (1, 2560) fp16: x of this layer before the previous layer's output is mixed in.
    """

    w13: torch.Tensor
    s13: torch.Tensor
    w2: torch.Tensor
    s2: torch.Tensor
    route_ids: torch.Tensor
    route_weights: torch.Tensor
    seed: torch.Tensor


def _random_words(
    shape: tuple[int, ...], gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Uniform random int32 words (every bit pattern is 8 valid 4-bit codes)."""
    count = math.prod(shape)
    raw = torch.randint(0, 256, (count * 4,), dtype=torch.uint8, generator=gen, device=device)
    return raw.view(torch.int32).view(shape)


def _random_meta(
    groups: int,
    cols: int,
    num_experts: int,
    fmt: MetaFormat,
    gen: torch.Generator,
    device: torch.device,
) -> torch.Tensor:
    """Metadata records for (E, groups, cols): scale in [2^-9, 2^-5], zero point 0..15."""
    shape = (num_experts, groups, cols)
    log2_scale = torch.rand(shape, generator=gen, device=device) * 4.0 - 9.0
    scale = torch.exp2(log2_scale).to(torch.float16)
    zero = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen, device=device)
    if fmt == "3byte":
        scale_bytes = scale.view(torch.uint8).view(*shape, 2)  # little endian: low, high
        return torch.cat([scale_bytes, zero.unsqueeze(-1)], dim=-1).contiguous()
    bias = -(zero.to(torch.float16)) * scale  # one FP16 rounding, the contract's bias rule
    halves = torch.stack([scale, bias], dim=-1).contiguous()  # (..., 2) fp16: low = scale
    return halves.view(torch.int32).view(shape)


def make_layer(
    fmt: MetaFormat,
    gen: torch.Generator,
    device: torch.device,
    num_experts: int = NUM_EXPERTS,
) -> LayerBanks:
    ids = torch.randperm(num_experts, generator=gen, device=device)[:TOP_K].to(torch.int32)
    weights = torch.rand(TOP_K, generator=gen, device=device) + 0.1
    return LayerBanks(
        w13=_random_words((num_experts, HIDDEN, W13_N // 8), gen, device),
        s13=_random_meta(HIDDEN // GROUP, W13_N, num_experts, fmt, gen, device),
        w2=_random_words((num_experts, INTERMEDIATE, HIDDEN // 8), gen, device),
        s2=_random_meta(INTERMEDIATE // GROUP, HIDDEN, num_experts, fmt, gen, device),
        route_ids=ids.view(1, TOP_K).contiguous(),
        route_weights=(weights / weights.sum()).view(1, TOP_K).contiguous(),
        seed=torch.randn(1, HIDDEN, generator=gen, device=device).to(torch.float16),
    )


_SHIFTS_BY_DEVICE: dict[torch.device, torch.Tensor] = {}


def _row_shifts(device: torch.device) -> torch.Tensor:
    """(8,) int32 shifts, made once per device: a host-to-device copy inside a CUDA-graph
    capture (the PyTorch baseline is captured) would be illegal."""
    shifts = _SHIFTS_BY_DEVICE.get(device)
    if shifts is None:
        shifts = torch.tensor(_SHIFT_OF_ROW, dtype=torch.int32).to(device)
        _SHIFTS_BY_DEVICE[device] = shifts
    return shifts


def unpack_codes(words: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """(E', K, N/8) int32 prepared words -> (E', K, N) int32 codes 0..15, row-major (k, n)."""
    e = words.shape[0]
    tiled = words.reshape(e, n // 32, k // 8, 32, 1)  # (E', t, k8, c, 1) int32
    shifts = _row_shifts(words.device)
    rows = (tiled >> shifts) & 0xF  # (E', t, k8, c, j): sign bits masked off
    return rows.permute(0, 2, 4, 1, 3).reshape(e, k, n)


def decode_meta(meta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E', G, N) int32 or (E', G, N, 3) uint8 -> (scale, bias), each (E', G, N) fp16."""
    if meta.dtype == torch.uint8:
        scale = meta[..., :2].contiguous().view(torch.float16).squeeze(-1)
        bias = -(meta[..., 2].to(torch.float16)) * scale  # rebuilt as the contract says
        return scale, bias
    halves = meta.contiguous().view(torch.float16)  # (E', G, 2N): scale, bias interleaved
    return halves[..., 0::2], halves[..., 1::2]


def dequantize(words: torch.Tensor, meta: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """Prepared words and metadata -> (E', K, N) fp16 weights, w = fp16(q * s + b) once.

    q * s + b is exact in FP32: q * s has at most 15 significant bits, |b| = |fp16(z s)| lies
    between |s| and 16 |s| (or is 0), so the sum spans at most ~17 bits above the lsb of s.
    The single rounding is the final conversion to FP16, as the contract's FP16 FMA.
    """
    codes = unpack_codes(words, k, n).to(torch.float32)
    scale, bias = decode_meta(meta)
    s = scale.to(torch.float32).repeat_interleave(GROUP, dim=1)
    b = bias.to(torch.float32).repeat_interleave(GROUP, dim=1)
    return torch.addcmul(b, codes, s).to(torch.float16)


def floor_expected_sum(layer: LayerBanks, ids: torch.Tensor, w13_only: bool = False) -> int:
    """Wrapping 32-bit sum of every int32 word of the routed experts' four tensors (w13_only:
    of the W13 weights and metadata only, what the floor's tuning mode cache_hint 2 reads)."""
    idx = ids.view(-1).to(torch.int64)
    idx = idx[(idx >= 0) & (idx < layer.w13.shape[0])]  # invalid routes read nothing
    total = 0
    if idx.numel() == 0:
        return 0
    banks = (layer.w13, layer.s13) if w13_only else (layer.w13, layer.s13, layer.w2, layer.s2)
    for bank in banks:
        words = bank[idx].contiguous().view(len(idx), -1).view(torch.int32)
        total += int(words.to(torch.int64).sum())
    return total & 0xFFFFFFFF
