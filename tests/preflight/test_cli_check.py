"""`qpnserve check` and `qpnserve fixture checkpoint` through CliRunner: exit codes, --json
schema, stdout/stderr split, no tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app
from qpnserve.preflight.report import PreflightReport
from tests.preflight.conftest import H200_CU130, V100_OK

runner = CliRunner()


def invoke(args: list[str], facts: Path | None = V100_OK):
    env = {"QPNSERVE_FACTS_FILE": str(facts)} if facts else {}
    return runner.invoke(app, args, env=env)


def test_check_exits_0_on_healthy_v100_and_prints_a_table() -> None:
    result = invoke(["check", "--only", "gpu,toolchain"])
    assert result.exit_code == 0, result.output
    assert "PASS  gpu.compute_capability" in result.stdout
    assert "no failures" in result.stdout


def test_check_exits_1_on_h200_and_json_validates_against_the_report_model() -> None:
    result = invoke(["check", "--json"], facts=H200_CU130)
    assert result.exit_code == 1
    report = PreflightReport.model_validate_json(result.stdout)
    assert not report.ok
    failed = {r.name for r in report.results if r.status == "FAIL"}
    assert {"gpu.compute_capability", "toolchain.torch_arch", "toolchain.nvcc"} <= failed
    assert "Traceback" not in result.output


def test_check_json_has_stable_top_level_keys(make_ckpt: Callable[..., Path]) -> None:
    result = invoke(["check", "--json", "--model", str(make_ckpt("ok", layers=1))])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {
        "schema_version",
        "ok",
        "groups",
        "tp",
        "awq_m1",
        "model",
        "results",
        "facts",
    }
    assert set(data["results"][0]) == {"group", "name", "status", "reason", "fix"}
    assert "tensors" not in data["facts"]["checkpoint"]  # the big table stays out of the JSON
    assert result.stderr == ""


def test_check_only_checkpoint_exit_code_ignores_machine(make_ckpt: Callable[..., Path]) -> None:
    model = str(make_ckpt("ok", layers=1))
    result = invoke(["check", "--only", "checkpoint", "--model", model], facts=H200_CU130)
    assert result.exit_code == 0, result.output
    assert "gpu." not in result.stdout


def test_check_rejects_broken_checkpoint_with_exit_1(make_ckpt: Callable[..., Path]) -> None:
    model = str(make_ckpt("group-128", layers=1))
    result = invoke(["check", "--model", model])
    assert result.exit_code == 1
    assert "FAIL  checkpoint.quantization  group_size 128 (needs 32)" in result.stdout
    assert "error: " in result.stderr


def test_check_missing_model_path_is_a_failed_check(tmp_path: Path) -> None:
    result = invoke(["check", "--only", "checkpoint", "--model", str(tmp_path / "absent")])
    assert result.exit_code == 1
    assert "FAIL  checkpoint.path" in result.stdout and "does not exist" in result.stdout
    assert "Traceback" not in result.output


def test_check_model_from_environment_variable(make_ckpt: Callable[..., Path]) -> None:
    model = str(make_ckpt("top-8", layers=1))
    env = {"QPNSERVE_FACTS_FILE": str(V100_OK), "QPNSERVE_MODEL": model}
    result = runner.invoke(app, ["check"], env=env)
    assert result.exit_code == 1
    assert "num_experts_per_tok 8 (needs 10)" in result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["check", "--only", "gpus"], "unknown check group(s): gpus"),
        (["check", "--only", "checkpoint"], "--only checkpoint needs --model"),
        (["check", "--tp", "0"], "--tp must be >= 1, got 0"),
    ],
)
def test_check_usage_errors_exit_2_with_one_line(args: list[str], words: str) -> None:
    result = invoke(args)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"error: {words}"
    assert result.stdout == ""


def test_check_bad_facts_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "facts.json"
    bad.write_text("{not json")
    result = invoke(["check"], facts=bad)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: QPNSERVE_FACTS_FILE=")
    assert "Traceback" not in result.output


def test_check_route_flag_from_environment_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"QPNSERVE_FACTS_FILE": str(V100_OK), "VLLM_SM70_AWQ_QWEN38_QPN_M1": "true"}
    result = runner.invoke(app, ["check", "--only", "toolchain"], env=env)
    assert result.exit_code == 1
    assert "FAIL  toolchain.route_flag" in result.stdout


def test_fixture_command_writes_sparse_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    result = runner.invoke(app, ["fixture", "checkpoint", str(out), "--layers", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["apparent_bytes"] > 2.5e9 and data["disk_bytes"] < 50e6
    assert (out / "config.json").is_file()


def test_fixture_command_rejects_unknown_variant_and_nonempty_dir(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["fixture", "checkpoint", str(tmp_path / "a"), "--variant", "x"])
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: unknown fixture variant 'x'")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep").write_text("")
    busy = runner.invoke(app, ["fixture", "checkpoint", str(tmp_path / "b")])
    assert busy.exit_code == 2
    assert (tmp_path / "b" / "keep").exists()


def test_fixture_list_names_every_variant() -> None:
    from qpnserve.fixtures.checkpoint import VARIANTS

    result = runner.invoke(app, ["fixture", "checkpoint", "--list", "--json"])
    assert result.exit_code == 0
    assert list(json.loads(result.stdout)) == list(VARIANTS)
