"""The checkpoint is gathered once, like the machine: checkpoint.py reads config.json, the index
and the shard headers and derives the layout once into a frozen CheckpointFacts; the checkpoint
checks only read that record (no file, no raw config, no layout derivation of their own)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import qpnserve.preflight
from qpnserve.config import load_settings
from qpnserve.preflight import layout, run_preflight
from qpnserve.preflight.checkpoint import probe_checkpoint
from tests.preflight.conftest import V100_OK

PACKAGE_DIR = Path(qpnserve.preflight.__file__).parent
CHECKPOINT_CHECKS = ("checks_checkpoint.py", "checks_config.py", "checks_tensors.py")
# What reads a file or walks a directory.
READING_MODULES = {"json", "os", "pathlib", "io", "shutil", "glob", "safetensors", "struct"}
READING_CALLS = {"open", "read_text", "read_bytes", "listdir", "iterdir", "scandir", "safe_open"}
# What turns config.json and the tensor names into the layout: the gather's job, done once.
DERIVATIONS = {
    "text_config",
    "quant_config",
    "moe_layer_indices",
    "layer_excluded",
    "layer_prefix",
    "modules_to_not_convert",
    "read_layout",
    "probe_checkpoint",
}


def _smells(source: str) -> list[str]:
    """Where a check module reads a file, the raw config.json, or derives the layout itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in READING_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in READING_MODULES:
                found.append(f"from {node.module} import")
            found += [f"import {a.name}" for a in node.names if a.name in DERIVATIONS]
        elif isinstance(node, ast.Name) and node.id in READING_CALLS | DERIVATIONS:
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in READING_CALLS:
            found.append(f".{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in DERIVATIONS:
            # The record's own fields share some names (ck.layout.layer_prefix): only the
            # layout module's functions are derivations.
            if isinstance(node.value, ast.Name) and node.value.id == "layout":
                found.append(f"layout.{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr == "config":
            found.append(".config (the raw config.json)")
    return found


@pytest.mark.parametrize("module", CHECKPOINT_CHECKS)
def test_checkpoint_checks_only_read_the_gathered_record(module: str) -> None:
    assert _smells((PACKAGE_DIR / module).read_text(encoding="utf-8")) == []


def test_the_scan_sees_a_check_that_re_derives_or_reads() -> None:
    sample = (
        "import json\n"
        "from qpnserve.preflight import layout\n"
        "def check(ck):\n"
        "    tc = layout.text_config(ck.config)\n"
        "    return open(ck.path).read()\n"
    )
    assert sorted(_smells(sample)) == [
        ".config (the raw config.json)",
        "import json",
        "layout.text_config",
        "open",
    ]


def test_one_check_run_reads_config_json_once_and_derives_the_layout_once(
    monkeypatch: pytest.MonkeyPatch, make_ckpt: Callable[..., Path]
) -> None:
    model = make_ckpt("not-converted", layers=4)
    calls: dict[str, int] = {"config.json": 0, "moe_layer_indices": 0, "quant_config": 0}
    real_read_text = Path.read_text

    def counting_read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == "config.json":
            calls["config.json"] += 1
        return real_read_text(self, *args, **kwargs)

    def counting(name: str) -> Callable[..., Any]:
        real = getattr(layout, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(Path, "read_text", counting_read_text)
    for name in ("moe_layer_indices", "quant_config"):
        monkeypatch.setattr(layout, name, counting(name))
    monkeypatch.setenv("QPNSERVE_FACTS_FILE", str(V100_OK))
    report = run_preflight(model, settings=load_settings())
    coverage = next(r for r in report.results if r.name == "checkpoint.coverage")
    assert coverage.status == "WARN"  # the run did judge the layout
    assert calls == {"config.json": 1, "moe_layer_indices": 1, "quant_config": 1}


def test_gathered_checkpoint_holds_its_layout_and_is_frozen(
    make_ckpt: Callable[..., Path],
) -> None:
    facts = probe_checkpoint(make_ckpt("not-converted", layers=4))
    assert facts.layout is not None
    lay = facts.layout
    assert lay.layer_prefix == "model.language_model.layers."
    assert (lay.moe_layers, lay.unquantized_moe_layers) == ((0, 1, 2, 3), (0, 3))
    assert lay.quantized_moe_layers == (1, 2)
    assert (lay.quant_method, lay.text["num_experts"]) == ("awq", 512)
    with pytest.raises(ValidationError):
        facts.config = {}  # type: ignore[misc]
    with pytest.raises(ValidationError):
        lay.moe_layers = ()  # type: ignore[misc]
    with pytest.raises(ValidationError):
        facts.shards[0].exists = False  # type: ignore[misc]


def test_gathered_layout_stays_out_of_the_json_facts(make_ckpt: Callable[..., Path]) -> None:
    dumped = json.loads(probe_checkpoint(make_ckpt("ok", layers=1)).model_dump_json())
    assert {"layout", "tensors", "index_weight_map"} & set(dumped) == set()
    assert dumped["config"]["text_config"]["num_experts"] == 512


def test_unreadable_config_is_recorded_without_a_layout(make_ckpt: Callable[..., Path]) -> None:
    path = make_ckpt("corrupt-json", layers=1)
    facts = probe_checkpoint(path)
    assert facts.layout is None and facts.config is None
    assert facts.config_error is not None and "not valid JSON" in facts.config_error


@pytest.mark.parametrize(
    ("config", "names", "want"),
    [
        # text-only: everything at the top level, layers named model.layers.N
        (
            {
                "num_hidden_layers": 4,
                "mlp_only_layers": [1],
                "decoder_sparse_step": 1,
                "quantization_config": {
                    "quant_method": "AWQ",
                    "modules_to_not_convert": ["model.layers.2.mlp"],
                },
            },
            ["lm_head.weight", "model.layers.0.mlp.gate.weight"],
            ("model.layers.", "awq", (0, 2, 3), (0, 3), (2,)),
        ),
        # quantization_config inside text_config; a bare-string exclusion excludes nothing
        (
            {
                "text_config": {
                    "num_hidden_layers": 2,
                    "quantization_config": {"modules_to_not_convert": "lm_head"},
                }
            },
            [],
            ("model.language_model.layers.", "", (0, 1), (0, 1), ()),
        ),
        # every second layer is MoE; a malformed step counts as 1
        (
            {"num_hidden_layers": 4, "decoder_sparse_step": 2},
            ["model.language_model.layers.0.x"],
            ("model.language_model.layers.", "", (1, 3), (1, 3), ()),
        ),
        (
            {"num_hidden_layers": 3, "decoder_sparse_step": "x"},
            [],
            ("model.language_model.layers.", "", (0, 1, 2), (0, 1, 2), ()),
        ),
    ],
)
def test_read_layout_derives_what_config_json_and_the_names_say(
    config: dict[str, Any], names: list[str], want: tuple[object, ...]
) -> None:
    lay = layout.read_layout(config, names)
    got = (
        lay.layer_prefix,
        lay.quant_method,
        lay.moe_layers,
        lay.quantized_moe_layers,
        lay.unquantized_moe_layers,
    )
    assert got == want
