"""The route's geometry and the checkpoint export's tensor names and shapes, pinned by the
literal values of the contract (sections 1 and 2), independently of the product's helpers.

The checkpoint fixture builds its tensors with the checker's own `expert_tensor_specs`, so the
two always agree with each other; only numbers written here, from the contract, can tell when
both are wrong. The fixture's shards are read here as raw safetensors headers (8-byte length,
JSON), not through the probe.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from qpnserve import geometry
from qpnserve.fixtures.checkpoint import write_checkpoint
from qpnserve.preflight import layout
from qpnserve.preflight.checks_tensors import check_tensors
from qpnserve.preflight.facts import CheckpointFacts, CheckpointLayout

# Contract section 1: one expert of the native AWQ group-32 export, 4-bit codes packed 8 to an
# int32 along N (GEMM packing). gate/up: K = hidden 2560, N = moe_intermediate 640; down: K = 640,
# N = 2560.
EXPERT_TENSORS = {
    "gate_proj.qweight": ("I32", (2560, 80)),
    "gate_proj.qzeros": ("I32", (80, 80)),
    "gate_proj.scales": ("F16", (80, 640)),
    "up_proj.qweight": ("I32", (2560, 80)),
    "up_proj.qzeros": ("I32", (80, 80)),
    "up_proj.scales": ("F16", (80, 640)),
    "down_proj.qweight": ("I32", (640, 320)),
    "down_proj.qzeros": ("I32", (20, 320)),
    "down_proj.scales": ("F16", (20, 2560)),
}
PREFIX = "model.language_model.layers."


def test_geometry_is_the_contracts() -> None:
    assert (geometry.NUM_EXPERTS, geometry.TOP_K, geometry.HIDDEN) == (512, 10, 2560)
    assert (geometry.MOE_INTERMEDIATE, geometry.TP_SIZE, geometry.INTERMEDIATE) == (640, 4, 160)
    assert (geometry.W13_N, geometry.GROUP, geometry.BITS) == (320, 32, 4)
    assert geometry.NUM_MOE_LAYERS == 48


def test_expert_tensor_specs_are_the_exports() -> None:
    specs = layout.expert_tensor_specs()
    assert {k: (v.dtype, v.shape) for k, v in specs.items()} == EXPERT_TENSORS


def _header(shard: Path) -> dict[str, dict[str, object]]:
    with shard.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))  # type: ignore[no-any-return]


def test_fixture_checkpoint_has_the_exports_names_shapes_and_config(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "ck", "ok", num_layers=2)
    config = json.loads((path / "config.json").read_text())
    text = config["text_config"]
    assert (text["num_experts"], text["num_experts_per_tok"], text["hidden_size"]) == (
        512,
        10,
        2560,
    )
    assert (text["moe_intermediate_size"], text["num_hidden_layers"]) == (640, 2)
    quant = config["quantization_config"]
    assert (quant["quant_method"], quant["bits"], quant["group_size"]) == ("awq", 4, 32)
    assert (quant["zero_point"], quant["version"]) == (True, "gemm")
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    header = _header(path / index[f"{PREFIX}1.mlp.experts.0.gate_proj.qweight"])
    experts = {n for n in header if n.startswith(f"{PREFIX}1.mlp.experts.")}
    assert len(experts) == 512 * 9
    for expert in (0, 511):
        for suffix, (dtype, shape) in EXPERT_TENSORS.items():
            tensor = header[f"{PREFIX}1.mlp.experts.{expert}.{suffix}"]
            assert (tensor["dtype"], tuple(tensor["shape"])) == (dtype, shape), suffix  # type: ignore[arg-type]


def _export(**change: tuple[str, tuple[int, ...]]) -> CheckpointFacts:
    """One MoE layer of the export as the contract states it, written here tensor by tensor."""
    tensors = {
        f"{PREFIX}0.mlp.experts.{e}.{suffix}": change.get(suffix.replace(".", "_"), spec)
        for e in range(512)
        for suffix, spec in EXPERT_TENSORS.items()
    }
    config = {
        "text_config": {
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "hidden_size": 2560,
            "moe_intermediate_size": 640,
            "num_hidden_layers": 1,
        },
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 32,
            "zero_point": True,
            "version": "gemm",
        },
    }
    # The layout as the gather would derive it from this config, written here.
    one_moe_layer = CheckpointLayout(
        text=config["text_config"],
        quantization=config["quantization_config"],
        quant_method="awq",
        layer_prefix=PREFIX,
        moe_layers=(0,),
        quantized_moe_layers=(0,),
        unquantized_moe_layers=(),
    )
    return CheckpointFacts(
        path="export",
        exists=True,
        is_dir=True,
        readable=True,
        config=config,
        layout=one_moe_layer,
        tensors=tensors,
    )


def test_checker_passes_the_export_as_the_contract_states_it() -> None:
    result = check_tensors(_export())
    assert result.status == "PASS", result.reason
    assert result.reason.startswith("4608 expert tensors in 1 MoE layers x 512 experts")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"down_proj_qzeros": ("I32", (20, 2560))}, "shape [20, 2560] (needs [20, 320])"),
        ({"gate_proj_scales": ("F16", (20, 640))}, "shape [20, 640] (needs [80, 640])"),
        ({"up_proj_qweight": ("I32", (2560, 640))}, "shape [2560, 640] (needs [2560, 80])"),
        ({"down_proj_scales": ("BF16", (20, 2560))}, "dtype BF16 (needs F16)"),
    ],
)
def test_checker_rejects_a_tensor_the_contract_does_not_give(
    change: dict[str, tuple[str, tuple[int, ...]]], words: str
) -> None:
    result = check_tensors(_export(**change))
    assert result.status == "FAIL"
    assert "512 of 4608 expert tensors differ" in result.reason
    assert words in result.reason
