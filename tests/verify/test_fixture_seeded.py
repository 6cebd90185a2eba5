"""The `seeded` fixture checkpoint: the export's names, shapes and dtypes pinned by literal values
from contract section 1 (read with safetensors directly, not through qpnserve's helpers), and
data that exercises every code, every zero point and realistic scales."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from qpnserve.verify.samples import routed_experts

# Contract section 1: AWQ GEMM packing, group 32, hidden 2560, moe_intermediate 640.
LITERAL_SHAPES = {
    "gate_proj.qweight": ("I32", [2560, 80]),
    "gate_proj.qzeros": ("I32", [80, 80]),
    "gate_proj.scales": ("F16", [80, 640]),
    "up_proj.qweight": ("I32", [2560, 80]),
    "up_proj.qzeros": ("I32", [80, 80]),
    "up_proj.scales": ("F16", [80, 640]),
    "down_proj.qweight": ("I32", [640, 320]),
    "down_proj.qzeros": ("I32", [20, 320]),
    "down_proj.scales": ("F16", [20, 2560]),
}


def _header(path: Path) -> dict:
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length))


def _open(ck: Path, name: str):  # type: ignore[no-untyped-def]
    shard = json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"][name]
    return ck / shard


@pytest.mark.parametrize("expert", [0, 511])
def test_seeded_export_names_and_shapes_are_the_contracts(
    seeded_checkpoint: Path, expert: int
) -> None:
    for layer in (0, 1):
        for suffix, (dtype, shape) in LITERAL_SHAPES.items():
            name = f"model.language_model.layers.{layer}.mlp.experts.{expert}.{suffix}"
            header = _header(_open(seeded_checkpoint, name))
            assert header[name]["dtype"] == dtype, name
            assert header[name]["shape"] == shape, name


def test_seeded_config_is_the_contracts(seeded_checkpoint: Path) -> None:
    config = json.loads((seeded_checkpoint / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "awq"
    assert config["quantization_config"]["group_size"] == 32
    assert config["quantization_config"]["zero_point"] is True
    assert config["quantization_config"]["version"] == "gemm"
    assert config["text_config"]["num_experts"] == 512
    assert config["text_config"]["moe_intermediate_size"] == 640


def _read(ck: Path, name: str) -> np.ndarray:
    with safe_open(str(_open(ck, name)), framework="numpy") as f:
        return f.get_tensor(name)


def _nibbles(words: np.ndarray) -> np.ndarray:
    u = words.view(np.uint32)
    return np.stack([(u >> (4 * i)) & 0xF for i in range(8)])


def test_seeded_experts_use_every_code_zero_point_and_realistic_scales(
    seeded_checkpoint: Path,
) -> None:
    layer = 1
    expert = routed_experts(layer)[0]
    base = f"model.language_model.layers.{layer}.mlp.experts.{expert}"
    for proj in ("gate_proj", "up_proj", "down_proj"):
        codes = _nibbles(_read(seeded_checkpoint, f"{base}.{proj}.qweight"))
        zeros = _nibbles(_read(seeded_checkpoint, f"{base}.{proj}.qzeros"))
        scales = _read(seeded_checkpoint, f"{base}.{proj}.scales").astype(np.float64)
        assert set(np.unique(codes)) == set(range(16))
        assert set(np.unique(zeros)) == set(range(16))
        assert scales.min() >= 0.99e-3 and scales.max() <= 1.01e-2
        assert scales.std() > 1e-3  # not one constant


def test_seeded_checkpoint_leaves_unread_experts_and_later_layers_as_holes(
    seeded_checkpoint: Path,
) -> None:
    unread = sorted(set(range(512)) - set(routed_experts(0)))[0]
    name = f"model.language_model.layers.0.mlp.experts.{unread}.up_proj.scales"
    assert not np.any(_read(seeded_checkpoint, name))
    # the fixture stays small: far below the 1.4 GB one dense layer would take
    allocated = sum(p.stat().st_blocks * 512 for p in seeded_checkpoint.iterdir())
    assert allocated < 250e6


def test_seeded_checkpoint_passes_the_checkpoint_preflight(seeded_checkpoint: Path) -> None:
    from typer.testing import CliRunner

    from qpnserve.cli import app

    result = CliRunner().invoke(
        app, ["check", "--only", "checkpoint", "--model", str(seeded_checkpoint)]
    )
    assert result.exit_code == 0, result.output
