"""One stand-in host layer whose banks stand for the host's preparation: made by qpnserve from
the checkpoint's export (the stand-in hosts have no preparation of their own), for the experts
the given prefixes' samples route to, with ``fault`` standing for a preparation bug."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from qpnserve.verify import prepare
from qpnserve.verify.export import Checkpoint
from qpnserve.verify.samples import routed_experts
from tests.dispatch.standin import StandInLayer


def layer_from_export(
    ck: Checkpoint,
    layer: int,
    rank: int,
    *,
    fmt: str = "3byte",
    fault: str | None = None,
    prefixes: Sequence[int] | None = None,
    tp: int = 4,
    device: str = "cpu",
    **overrides: Any,
) -> StandInLayer:
    banks = prepare.Banks(fmt, device)  # type: ignore[arg-type]
    experts = routed_experts(layer) if prefixes is None else routed_experts(layer, list(prefixes))
    for e in experts:
        banks.write(e, prepare.share(ck.expert(layer, e), rank, fault))
    return StandInLayer(
        stand_in_prepared={
            "w13_tm_weight": banks.w13,
            "w13_tm_scales": banks.s13,
            "w2_tm_weight": banks.w2,
            "w2_tm_scales": banks.s2,
        },
        layer_name=f"{ck.layer_prefix}{layer}.mlp.experts",
        moe_config=types.SimpleNamespace(tp_size=tp, tp_rank=rank),
        stand_in_overrides=overrides,
        stand_in_host_op=True,  # a native stand-in calls the host op's stand-in on these banks
    )
