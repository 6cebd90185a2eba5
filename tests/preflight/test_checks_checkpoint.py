"""Every broken checkpoint variant is rejected by its own check with its own reason; a healthy
one passes; layers kept unquantized are a warning, not a broken checkpoint."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from qpnserve.preflight import checkpoint as checkpoint_probe
from qpnserve.preflight.checkpoint import probe_checkpoint
from qpnserve.preflight.checks_checkpoint import checkpoint_checks
from qpnserve.preflight.report import CheckResult


def run(path: Path, tp: int = 4) -> dict[str, CheckResult]:
    return {r.name: r for r in checkpoint_checks(probe_checkpoint(path), tp)}


def test_check_passes_healthy_checkpoint(make_ckpt: Callable[..., Path]) -> None:
    results = run(make_ckpt("ok"))
    assert {n: r.status for n, r in results.items() if r.status != "PASS"} == {}
    assert "3 MoE layers" in results["checkpoint.config"].reason
    assert "13824 expert tensors" in results["checkpoint.tensors"].reason


@pytest.mark.parametrize(
    ("variant", "check", "words"),
    [
        ("group-128", "checkpoint.quantization", "group_size 128 (needs 32)"),
        ("experts-256", "checkpoint.config", "num_experts 256 (needs 512)"),
        ("top-8", "checkpoint.config", "num_experts_per_tok 8 (needs 10)"),
        ("hidden-4096", "checkpoint.config", "hidden_size 4096 (needs 2560)"),
        ("bits-8", "checkpoint.quantization", "bits 8 (needs 4)"),
        ("no-zero-point", "checkpoint.quantization", "zero_point False (needs true)"),
        ("missing-shard", "checkpoint.shards", "1 shard(s) missing: model-00002-of-00004"),
        ("truncated-header", "checkpoint.shards", "unreadable: model-00001-of-00004.safetensors"),
        ("corrupt-json", "checkpoint.config", "config.json is not valid JSON"),
        ("corrupt-index", "checkpoint.shards", "model.safetensors.index.json is not valid JSON"),
        ("missing-expert-tensor", "checkpoint.tensors", "layers.1.mlp.experts.7.down_proj.scales"),
        ("wrong-dtype", "checkpoint.tensors", "dtype BF16 (needs F16)"),
    ],
)
def test_check_rejects_broken_checkpoint_variant(
    make_ckpt: Callable[..., Path], variant: str, check: str, words: str
) -> None:
    results = run(make_ckpt(variant))
    assert results[check].status == "FAIL", results[check]
    assert words in results[check].reason
    assert results[check].fix


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("group-128", "wrong shape"),
        ("hidden-4096", "wrong shape"),
        ("bits-8", "wrong shape"),
        ("no-zero-point", "missing"),
        ("experts-256", "missing"),
    ],
)
def test_check_names_tensor_shape_problems_of_misquantized_checkpoints(
    make_ckpt: Callable[..., Path], variant: str, words: str
) -> None:
    tensors = run(make_ckpt(variant))["checkpoint.tensors"]
    assert tensors.status == "FAIL"
    assert words in tensors.reason
    assert "first: model.language_model.layers.0.mlp.experts." in tensors.reason


def test_check_reports_first_offenders_and_counts_the_rest(make_ckpt: Callable[..., Path]) -> None:
    reason = run(make_ckpt("wrong-dtype"))["checkpoint.tensors"].reason
    assert reason.startswith("1536 of 13824 expert tensors differ")
    assert reason.count("experts.") == 3


@pytest.mark.parametrize("variant", ["missing-shard", "truncated-header"])
def test_check_blames_the_shard_not_the_export_for_tensors_it_could_not_read(
    make_ckpt: Callable[..., Path], variant: str
) -> None:
    results = run(make_ckpt(variant))
    tensors = results["checkpoint.tensors"]
    assert tensors.status == "FAIL"
    assert "could not be checked" in tensors.reason and "see checkpoint.shards" in tensors.reason
    assert "differ from native group 32" not in tensors.reason
    assert tensors.fix == results["checkpoint.shards"].fix


def test_check_names_export_offenders_first_when_a_shard_is_also_missing(
    make_ckpt: Callable[..., Path],
) -> None:
    path = make_ckpt("wrong-dtype")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    expert = "model.language_model.layers.{}.mlp.experts.0.down_proj.scales"
    other = weight_map[expert.format(2)]
    assert other != weight_map[expert.format(0)]
    (path / other).unlink()
    tensors = run(path)["checkpoint.tensors"]
    assert tensors.status == "FAIL"
    assert "(1536 wrong dtype); first: model.language_model.layers.0." in tensors.reason
    assert "besides, " in tensors.reason and other in tensors.reason
    assert tensors.fix.startswith("use the native AWQ group-32 export")


def test_check_warns_on_layers_kept_unquantized(make_ckpt: Callable[..., Path]) -> None:
    results = run(make_ckpt("not-converted", layers=4))
    coverage = results["checkpoint.coverage"]
    assert coverage.status == "WARN"
    assert "layer(s) 0, 3" in coverage.reason and "covers 2 of 4" in coverage.reason
    assert results["checkpoint.tensors"].status == "PASS"
    assert all(r.status != "FAIL" for r in results.values())


def test_check_fails_on_tp_that_does_not_give_160_per_rank(make_ckpt: Callable[..., Path]) -> None:
    config = run(make_ckpt("ok"), tp=2)["checkpoint.config"]
    assert config.status == "FAIL"
    assert "= 320 per rank" in config.reason


@pytest.mark.parametrize("tp", [1, 2, 3, 8])
def test_check_at_another_tp_blames_the_tp_not_the_checkpoint(
    make_ckpt: Callable[..., Path], tp: int
) -> None:
    results = run(make_ckpt("ok"), tp=tp)
    config = results["checkpoint.config"]
    assert config.status == "FAIL"
    assert config.fix.startswith("use --tp 4")
    assert "export" not in config.fix and "requantize" not in config.fix
    assert "the checkpoint's geometry fits, the TP does not" in config.reason
    others = {n: r.status for n, r in results.items() if n != "checkpoint.config"}
    assert set(others.values()) == {"PASS"}, others


def test_check_of_a_wrong_checkpoint_at_another_tp_still_asks_for_the_export(
    make_ckpt: Callable[..., Path],
) -> None:
    config = run(make_ckpt("experts-256"), tp=2)["checkpoint.config"]
    assert config.status == "FAIL"
    assert "num_experts 256 (needs 512)" in config.reason
    assert config.fix.startswith("use the native AWQ group-32 export")
    assert "--tp 4" in config.fix


def test_check_fails_missing_model_path_and_skips_the_rest(tmp_path: Path) -> None:
    results = run(tmp_path / "nope")
    assert results["checkpoint.path"].status == "FAIL"
    assert "does not exist" in results["checkpoint.path"].reason
    assert {r.status for n, r in results.items() if n != "checkpoint.path"} == {"SKIP"}


def test_check_fails_model_path_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    path = run(file)["checkpoint.path"]
    assert path.status == "FAIL"
    assert "not a directory" in path.reason


def test_check_fails_unreadable_model_directory(
    make_ckpt: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error a directory without read permission gives, raised where the probe lists it
    (root reads any directory, so CI as root could not make one with chmod)."""
    path = make_ckpt("ok", layers=1)

    def denied(target: object) -> list[str]:
        if Path(str(target)) == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(target))
        return real_listdir(target)  # type: ignore[arg-type]

    real_listdir = os.listdir
    monkeypatch.setattr(checkpoint_probe.os, "listdir", denied)
    results = run(path)
    assert results["checkpoint.path"].status == "FAIL"
    assert results["checkpoint.path"].reason == f"{path} cannot list it: Permission denied"
    assert {r.status for n, r in results.items() if n != "checkpoint.path"} == {"SKIP"}


def test_check_fails_unreadable_config(make_ckpt: Callable[..., Path]) -> None:
    path = make_ckpt("ok", layers=1)
    (path / "config.json").unlink()
    (path / "config.json").mkdir()  # exists, cannot be read as a file, even by root
    config = run(path)["checkpoint.config"]
    assert config.status == "FAIL"
    assert "config.json is unreadable" in config.reason


def test_check_warns_on_shard_the_index_does_not_name(make_ckpt: Callable[..., Path]) -> None:
    path = make_ckpt("ok", layers=1)
    (path / "stray.safetensors").write_bytes(b"")
    shards = run(path)["checkpoint.shards"]
    assert shards.status == "WARN"
    assert "stray.safetensors" in shards.reason


@pytest.mark.slow
def test_check_passes_full_size_sparse_checkpoint(tmp_path: Path) -> None:
    from qpnserve.fixtures.checkpoint import write_checkpoint

    path = write_checkpoint(tmp_path / "full", "ok", num_layers=48)
    allocated = sum(f.stat().st_blocks * 512 for f in path.iterdir())
    apparent = sum(f.stat().st_size for f in path.iterdir())
    assert apparent > 60e9 and allocated < 200e6
    results = run(path)
    assert all(r.status == "PASS" for r in results.values()), results
    assert "221184 expert tensors in 48 MoE layers" in results["checkpoint.tensors"].reason


@pytest.mark.parametrize(
    ("config", "coverage", "why"),
    [
        # text_config that is not an object: the top level is read, and it names no layers
        ({"text_config": [], "quantization_config": []}, "SKIP", "no MoE layers in config.json"),
        (
            {"num_hidden_layers": "48", "mlp_only_layers": 5, "decoder_sparse_step": "x"},
            "SKIP",
            "no MoE layers in config.json",
        ),
        # two layers and no AWQ method: a bare-string modules_to_not_convert excuses nothing
        (
            {"num_hidden_layers": 2, "quantization_config": {"modules_to_not_convert": "lm_head"}},
            "FAIL",
            "covers none of the 2 MoE layers",
        ),
        (
            {
                "num_experts": None,
                "moe_intermediate_size": "640",
                "quantization_config": {"bits": []},
            },
            "SKIP",
            "no MoE layers in config.json",
        ),
        ([], "SKIP", "needs a readable config.json"),
    ],
)
def test_check_survives_malformed_config_values(
    make_ckpt: Callable[..., Path], config: object, coverage: str, why: str
) -> None:
    """A malformed config never crashes a check, and coverage, which then examined no layer
    (or found no AWQ experts), never passes."""
    path = make_ckpt("ok", layers=1)
    (path / "config.json").write_text(json.dumps(config))
    results = run(path)
    assert results["checkpoint.config"].status == "FAIL"
    assert results["checkpoint.coverage"].status == coverage
    assert why in results["checkpoint.coverage"].reason


def test_check_fails_when_every_moe_layer_is_kept_unquantized(
    make_ckpt: Callable[..., Path],
) -> None:
    import json

    path = make_ckpt("ok", layers=2)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["mlp.experts"]
    (path / "config.json").write_text(json.dumps(config))
    results = run(path)
    assert results["checkpoint.coverage"].status == "FAIL"
    assert "every MoE layer" in results["checkpoint.coverage"].reason
    assert results["checkpoint.tensors"].status == "SKIP"


def _strip_quantization(path: Path) -> Path:
    config = json.loads((path / "config.json").read_text())
    config.pop("quantization_config")
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_coverage_fails_checkpoint_without_awq_experts(make_ckpt: Callable[..., Path]) -> None:
    coverage = run(_strip_quantization(make_ckpt("ok")))["checkpoint.coverage"]
    assert coverage.status == "FAIL"
    assert "covers none of the 3 MoE layers" in coverage.reason
    assert "no AWQ experts (no quantization_config)" in coverage.reason


def test_route_off_turns_the_route_checkpoint_contract_into_warnings(
    make_ckpt: Callable[..., Path],
) -> None:
    path = _strip_quantization(make_ckpt("experts-256"))
    on = run(path)
    off = {r.name: r for r in checkpoint_checks(probe_checkpoint(path), 4, awq_m1=False)}
    route_only = ["config", "quantization", "tensors", "coverage"]
    assert {on[f"checkpoint.{n}"].status for n in route_only} == {"FAIL"}
    for n in route_only:
        result = off[f"checkpoint.{n}"]
        assert result.status == "WARN", result
        assert result.reason.startswith("the route cannot serve this checkpoint: ")
    assert "num_experts 256 (needs 512)" in off["checkpoint.config"].reason


def test_route_off_still_fails_a_checkpoint_the_host_cannot_read(
    make_ckpt: Callable[..., Path],
) -> None:
    path = make_ckpt("missing-shard")
    off = {r.name: r for r in checkpoint_checks(probe_checkpoint(path), 4, awq_m1=False)}
    assert off["checkpoint.shards"].status == "FAIL"


def test_check_config_quotes_a_number_written_as_a_string(make_ckpt: Callable[..., Path]) -> None:
    path = make_ckpt("ok", layers=1)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["moe_intermediate_size"] = "640"
    (path / "config.json").write_text(json.dumps(config))
    reason = run(path)["checkpoint.config"].reason
    assert reason == "moe_intermediate_size '640' (needs 640: 160 per rank at TP4)"
