"""The seeded synthetic samples of `verify --offline`: one router pick and one activation per
(MoE layer, prefix). Pure numpy; the fixture checkpoint imports ``routed_experts`` so that its
seeded experts are exactly the ones verify reads.

Realistic scale: the MoE input is a post-RMSNorm hidden state, so x ~ N(0, 1) in FP16 with a few
outlier channels (x8), as real hidden states have; router weights are the softmax of the ten
largest of 512 logits, renormalised over those ten (Qwen3-MoE's norm_topk_prob), in router order
(largest first, not sorted by id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qpnserve.geometry import HIDDEN, NUM_EXPERTS, TOP_K

NUM_PREFIXES = 3  # the origin's acceptance used three fixed prefixes
SEED = 20261201
_OUTLIER_CHANNELS = 8
_OUTLIER_GAIN = 8.0


@dataclass(frozen=True)
class Sample:
    layer: int
    prefix: int
    x: np.ndarray  # (2560,) float16
    ids: np.ndarray  # (10,) int32, router order, distinct, in [0, 512)
    weights: np.ndarray  # (10,) float32, > 0, sum 1


def _rng(layer: int, prefix: int) -> np.random.Generator:
    return np.random.default_rng([SEED, layer, prefix])


def sample(layer: int, prefix: int) -> Sample:
    rng = _rng(layer, prefix)
    logits = rng.standard_normal(NUM_EXPERTS)
    ids = np.argsort(-logits, kind="stable")[:TOP_K]
    top = np.exp(logits[ids] - logits[ids].max())
    weights = (top / top.sum()).astype(np.float32)
    x = rng.standard_normal(HIDDEN)
    outliers = rng.choice(HIDDEN, size=_OUTLIER_CHANNELS, replace=False)
    x[outliers] *= _OUTLIER_GAIN
    return Sample(layer, prefix, x.astype(np.float16), ids.astype(np.int32), weights)


def routed_experts(layer: int, prefixes: range | list[int] = range(NUM_PREFIXES)) -> list[int]:
    """The distinct experts the samples of ``layer`` route to (sorted)."""
    return sorted({int(e) for p in prefixes for e in sample(layer, p).ids})
