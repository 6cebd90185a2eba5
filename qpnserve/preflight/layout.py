"""The checkpoint layout the AWQ M1 route needs (contract section 1), as pure functions.

Shared by the checkpoint checks and the synthetic checkpoint generator, so the two cannot
disagree about a shape; the numbers themselves are qpnserve.geometry's. ``read_layout`` is the
one place a checkpoint's config.json and tensor names are turned into its layout (the MoE
layers, their tensor-name prefix, the quantization and the layers it leaves out): the preflight's
gather and `verify` call it once per checkpoint.

AWQ GEMM packing, 4 bits (pack factor 32 / 4 = 8 codes per int32), per expert projection with
``in_features`` K and ``out_features`` N, group g along K:
- qweight (K, N / 8) int32
- qzeros  (K / g, N / 8) int32
- scales  (K / g, N) float16
gate_proj and up_proj map hidden 2560 -> moe_intermediate 640; down_proj maps 640 -> 2560.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from qpnserve import geometry
from qpnserve.preflight.facts import CheckpointLayout

EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
EXPERT_PARTS = ("qweight", "qzeros", "scales")
LAYER_PREFIXES = ("model.language_model.layers.", "model.layers.")
DEFAULT_LAYER_PREFIX = LAYER_PREFIXES[0]


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # safetensors dtype name: "I32", "F16", ...
    shape: tuple[int, ...]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's config: ``text_config`` when present (multimodal wrapper), else the top
    level (text-only checkpoints)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def quant_config(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``quantization_config`` at the top level, else inside ``text_config``."""
    for where in (config, text_config(config)):
        q = where.get("quantization_config")
        if isinstance(q, Mapping):
            return q
    return None


def moe_layer_indices(tc: Mapping[str, Any]) -> list[int]:
    """Indices of the decoder layers whose MLP is a sparse MoE block.

    Qwen MoE configs mark dense layers with ``mlp_only_layers`` and place MoE blocks every
    ``decoder_sparse_step`` layers (default: every layer).
    """
    num_layers = tc.get("num_hidden_layers")
    if not isinstance(num_layers, int) or num_layers < 0:
        return []
    raw_dense = tc.get("mlp_only_layers") or []
    dense = {i for i in raw_dense if isinstance(i, int)} if isinstance(raw_dense, list) else set()
    step = tc.get("decoder_sparse_step") or 1
    if not isinstance(step, int) or step < 1:
        step = 1
    return [i for i in range(num_layers) if i not in dense and (i + 1) % step == 0]


def expert_prefix(layer_prefix: str, layer: int) -> str:
    """The module prefix vLLM gives the fused experts of one layer (matched against
    ``modules_to_not_convert``)."""
    return f"{layer_prefix}{layer}.mlp.experts"


def expert_tensor_specs(
    hidden_size: int = geometry.HIDDEN,
    intermediate_size: int = geometry.MOE_INTERMEDIATE,
    group_size: int = geometry.GROUP,
    bits: int = geometry.BITS,
) -> dict[str, TensorSpec]:
    """ "<proj>.<part>" -> spec, for one expert in AWQ GEMM packing."""
    pack = geometry.WORD_BITS // bits
    specs: dict[str, TensorSpec] = {}
    for proj, k, n in (
        ("gate_proj", hidden_size, intermediate_size),
        ("up_proj", hidden_size, intermediate_size),
        ("down_proj", intermediate_size, hidden_size),
    ):
        specs[f"{proj}.qweight"] = TensorSpec("I32", (k, n // pack))
        specs[f"{proj}.qzeros"] = TensorSpec("I32", (k // group_size, n // pack))
        specs[f"{proj}.scales"] = TensorSpec("F16", (k // group_size, n))
    return specs


def layer_excluded(layer_prefix: str, layer: int, modules_to_not_convert: list[str]) -> bool:
    """Whether the host keeps this layer's experts unquantized: vLLM's AWQ skip rule is a
    substring test of each ``modules_to_not_convert`` entry against the layer prefix."""
    prefix = expert_prefix(layer_prefix, layer)
    return any(m and m in prefix for m in modules_to_not_convert)


def layer_prefix(tensor_names: Collection[str]) -> str:
    """The decoder layers' tensor-name prefix: the first of LAYER_PREFIXES that a name starts
    with (a multimodal wrapper's, then a text-only model's), else the wrapper's."""
    return next(
        (p for p in LAYER_PREFIXES if any(n.startswith(p) for n in tensor_names)),
        DEFAULT_LAYER_PREFIX,
    )


def modules_to_not_convert(quant: Mapping[str, Any] | None) -> list[str]:
    raw = (quant or {}).get("modules_to_not_convert") or []
    # A bare string would iterate as characters and match every layer.
    return [m for m in raw if isinstance(m, str)] if isinstance(raw, list) else []


def read_layout(config: Mapping[str, Any], tensor_names: Collection[str]) -> CheckpointLayout:
    """The layout of a checkpoint from its config.json (as parsed) and ``tensor_names`` (the
    names the prefix is told from)."""
    text = text_config(config)
    quant = quant_config(config)
    prefix = layer_prefix(tensor_names)
    moe_layers = moe_layer_indices(text)
    not_convert = modules_to_not_convert(quant)
    unquantized = [i for i in moe_layers if layer_excluded(prefix, i, not_convert)]
    return CheckpointLayout(
        text=dict(text),
        quantization=dict(quant) if quant is not None else None,
        quant_method=str((quant or {}).get("quant_method", "")).lower(),
        layer_prefix=prefix,
        moe_layers=tuple(moe_layers),
        quantized_moe_layers=tuple(i for i in moe_layers if i not in unquantized),
        unquantized_moe_layers=tuple(unquantized),
    )
