"""The FP64 reference of `verify`, decoded from the checkpoint's own exported AWQ tensors.

Never from prepared banks: a bank preparation that does not match the export (a wrong nibble
order, gate and up not interleaved, a zero point off by one) is then caught, not only an
operator bug. The roundings are contract section 4's, evaluated in FP64:
  b = fp16(-z * s); w = fp16(q * s + b) (q * s + b is exact in FP64: one rounding, the FMA);
  gate, up = fp16(x . w); h = fp16(fp16(silu(gate)) * up); y_r = fp16(h . w2);
  out = fp16(sum_r weights[r] * y_r) in router order.
One TP rank sees columns 160*rank .. 160*rank+159 of gate_proj and up_proj (W13) and the same
rows of down_proj (W2); its out is the rank's partial sum, before the host's all-reduce.

A sample that exercises nothing is not a sample: all-zero activations, or a routed expert whose
gate, up or down share on the rank is all zero (a hole in the file), or an all-zero result, is a
refusal with its reason, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qpnserve.geometry import GROUP, INTERMEDIATE, TP_SIZE
from qpnserve.verify.export import ExpertExport, ProjExport
from qpnserve.verify.samples import Sample

# AWQ GEMM packing (the checkpoint's own order, along N): nibble i (bits 4i..4i+3) of word c of
# a row holds column 8c + AWQ_ORDER[i].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def awq_unpack(words: np.ndarray) -> np.ndarray:
    """(R, C/8) int32 in AWQ GEMM packing -> (R, C) int64 codes 0..15."""
    u = words.view(np.uint32)
    rows, num_words = u.shape
    codes = np.empty((rows, num_words * 8), dtype=np.int64)
    for nibble, column in enumerate(AWQ_ORDER):
        codes[:, column::8] = (u >> np.uint32(4 * nibble)) & 0xF
    return codes


def dequantize(proj: ProjExport) -> np.ndarray:
    """(K, N) float64 holding the FP16 values w = fp16(q * s + fp16(-z * s))."""
    q = awq_unpack(proj.qweight).astype(np.float64)
    z = awq_unpack(proj.qzeros).astype(np.float64)
    s = proj.scales.astype(np.float64)
    with np.errstate(over="ignore"):
        b = (-z * s).astype(np.float16).astype(np.float64)
        s_k = np.repeat(s, GROUP, axis=0)
        b_k = np.repeat(b, GROUP, axis=0)
        return (q * s_k + b_k).astype(np.float16).astype(np.float64)


def _fp16(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(np.float64)


@dataclass(frozen=True)
class RankReference:
    rank: int
    h: np.ndarray  # (10, 160) float64 of FP16 values: the W13 stage (intermediate)
    out: np.ndarray  # (2560,) float64 of FP16 values: the W2 stage (this rank's partial out)
    refused: str | None = None  # why this sample examines nothing (then h, out are zeros)


@dataclass(frozen=True)
class _Dequantized:
    gate: np.ndarray  # (2560, 640)
    up: np.ndarray  # (2560, 640)
    down: np.ndarray  # (640, 2560)


def reference(
    sample: Sample, experts: dict[int, ExpertExport], ranks: list[int] | range = range(TP_SIZE)
) -> list[RankReference]:
    """The reference of ``sample`` on each of ``ranks``; ``experts`` holds every routed id."""
    x = sample.x.astype(np.float64)
    if not np.any(x):
        return [_refused(r, "the activation x is all zero") for r in ranks]
    h = {r: np.zeros((len(sample.ids), INTERMEDIATE)) for r in ranks}
    acc = {r: np.zeros(x.shape[0]) for r in ranks}
    refused: dict[int, str] = {}
    for slot, expert in enumerate(sample.ids):
        ex = experts[int(expert)]
        w = _Dequantized(dequantize(ex.gate), dequantize(ex.up), dequantize(ex.down))
        for rank in ranks:
            cols = slice(INTERMEDIATE * rank, INTERMEDIATE * (rank + 1))
            parts = {"gate": w.gate[:, cols], "up": w.up[:, cols], "down": w.down[cols, :]}
            empty = [name for name, part in parts.items() if not np.any(part)]
            if empty and rank not in refused:
                refused[rank] = (
                    f"expert {int(expert)}'s {'/'.join(empty)} weights are all zero on rank "
                    f"{rank} (a hole in the checkpoint?)"
                )
            gate = _fp16(x @ parts["gate"])
            up = _fp16(x @ parts["up"])
            with np.errstate(over="ignore"):
                silu = _fp16(gate / (1.0 + np.exp(-gate)))
            h_r = _fp16(silu * up)
            h[rank][slot] = h_r
            y = _fp16(h_r @ parts["down"])
            acc[rank] += float(sample.weights[slot]) * y
    results = []
    for rank in ranks:
        out = _fp16(acc[rank])
        why = refused.get(rank)
        if why is None and not np.any(h[rank]):
            why = "every reference intermediate is zero"
        if why is None and not np.any(out):
            why = "the reference output is all zero"
        results.append(_refused(rank, why) if why else RankReference(rank=rank, h=h[rank], out=out))
    return results


def _refused(rank: int, why: str) -> RankReference:
    return RankReference(rank=rank, h=np.zeros((1, INTERMEDIATE)), out=np.zeros(1), refused=why)
