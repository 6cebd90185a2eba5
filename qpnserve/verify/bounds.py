"""The fraction of the retained rounding bound used: contract section 4's acceptance bounds for
random x, as one number per stage (<= 1: within the contract). Pure numpy.

W13 (the intermediate h, (10, 160) per rank), per element i, with d_i = |got_i - ref_i|:
  the contract accepts d_i within 2 FP16 ulps of ref_i OR within 2^-10 * max|h_ref|, so the
  element uses min(ulps_i / 2, d_i / (2^-10 * max|h_ref|)) of its bound; the stage's figure is
  the largest over the elements. The contract also requires equality on >= 98% of the elements:
  reported as ``equal_share`` and part of the verdict.
W2 (out, (2560,) per rank): the contract accepts max|d| <= 2e-3 * max|ref| + 2^-24 AND
  ||d||_2 <= 2e-3 * ||ref||_2 + sqrt(2560) * 2^-24, so the figure is the larger of the two ratios.
A non-finite output element uses an infinite fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

W13_ULPS = 2
W13_REL = 2.0**-10
MIN_EQUAL_SHARE = 0.98
W2_REL = 2e-3
W2_ABS = 2.0**-24

BOUNDS_TEXT = {
    "w13": "each element of h within 2 FP16 ulps of the reference or within 2^-10 * max|h_ref|; "
    "equal on >= 98% of the elements",
    "w2": "max|d| <= 2e-3 * max|ref| + 2^-24 and ||d||_2 <= 2e-3 * ||ref||_2 + sqrt(2560) * 2^-24",
}


@dataclass(frozen=True)
class StageUse:
    fraction: float  # of the retained bound used (largest element for W13); <= 1 is within
    equal_share: float | None = None  # W13 only: share of elements bit-equal to the reference

    @property
    def within(self) -> bool:
        if not self.fraction <= 1.0:
            return False
        return self.equal_share is None or self.equal_share >= MIN_EQUAL_SHARE


def _ordered(a: np.ndarray) -> np.ndarray:
    """FP16 bit patterns on a monotone integer line (so differences count ulps)."""
    bits = a.astype(np.float16).view(np.int16).astype(np.int64)
    return np.where(bits < 0, -32768 - bits, bits)


def w13_use(got: np.ndarray, ref: np.ndarray) -> StageUse:
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    if not np.isfinite(got).all():
        return StageUse(math.inf, float(np.mean(got == ref)))
    ulps = np.abs(_ordered(got) - _ordered(ref)).astype(np.float64)
    scale = W13_REL * float(np.max(np.abs(ref)))
    diff = np.abs(got - ref)
    rel = diff / scale if scale > 0 else np.where(diff > 0, math.inf, 0.0)
    per_element = np.minimum(ulps / W13_ULPS, rel)
    return StageUse(float(per_element.max()), float(np.mean(ulps == 0)))


def w2_use(got: np.ndarray, ref: np.ndarray) -> StageUse:
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    if not np.isfinite(got).all():
        return StageUse(math.inf)
    diff = got - ref
    max_bound = W2_REL * float(np.max(np.abs(ref))) + W2_ABS
    l2_bound = W2_REL * float(np.linalg.norm(ref)) + math.sqrt(ref.size) * W2_ABS
    return StageUse(
        max(float(np.max(np.abs(diff))) / max_bound, float(np.linalg.norm(diff)) / l2_bound)
    )
