"""The host's per-layer filters of its batched MoE GEMM, read the way the host reads them.

Both 1Cat-vLLM v1.3.0 and ReVolta 0.1.4 (``awq_sm70_moe.py``) take
``VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST`` and ``..._DENYLIST`` as comma-separated layer ids
and inclusive ranges ("3,5-7"); blanks between commas are skipped; an unparsable item or a
negative id raises at model load. A layer is on the batched path when the allowlist (if set,
even to "") contains it and the denylist (if set) does not. A layer off that path has
``sm70_awq_moe_batched_gemm`` False: qpnserve's init contract refuses it and ReVolta's explicit
route flag fails closed on it, so with the route on either server stops at load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qpnserve import geometry

ALLOWLIST = "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST"
DENYLIST = "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST"
LAYER_FILTERS = (ALLOWLIST, DENYLIST)


class LayerFilterError(ValueError):
    """The value the host would refuse at model load."""


def parse_layer_ids(raw: str, name: str) -> set[int]:
    ids: set[int] = set()
    for item in (piece.strip() for piece in raw.split(",")):
        if not item:
            continue
        start_text, dash, end_text = item.partition("-")
        try:
            start = int(start_text)
            end = int(end_text) if dash else start
        except ValueError:
            raise LayerFilterError(f"{name}={raw!r}: {item!r} is not a layer id or range") from None
        if start < 0 or end < start:
            raise LayerFilterError(f"{name}={raw!r}: {item!r} is not a valid layer range")
        ids.update(range(start, end + 1))
    return ids


def excluded_layers(env: Mapping[str, str], num_layers: int = geometry.NUM_MOE_LAYERS) -> list[int]:
    """MoE layers (0..num_layers-1) the filters take off the batched path; LayerFilterError
    when a filter does not parse."""
    allow = parse_layer_ids(env[ALLOWLIST], ALLOWLIST) if ALLOWLIST in env else None
    deny = parse_layer_ids(env[DENYLIST], DENYLIST) if DENYLIST in env else set()
    return [
        layer
        for layer in range(num_layers)
        if (allow is not None and layer not in allow) or layer in deny
    ]


def describe_layers(layers: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
