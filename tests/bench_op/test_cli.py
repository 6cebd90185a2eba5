"""`qpnserve bench op` command line: bad options, --json on failure, no GPU, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from qpnserve.cli import app

runner = CliRunner()

# The keys of every --json failure document (the server benchmarks' too).
ERROR_KEYS = {"kind", "ok", "command", "exit_code", "error", "hint"}


def test_bench_op_rejects_unknown_format_with_usage_exit() -> None:
    result = runner.invoke(app, ["bench", "op", "--format", "5byte"])
    assert result.exit_code == 2
    assert "--format must be 4byte or 3byte" in result.output


def test_bench_op_rejects_zero_layers() -> None:
    result = runner.invoke(app, ["bench", "op", "--layers", "0"])
    assert result.exit_code == 2


@pytest.mark.parametrize("name", ["auto", "mma884", "polled", "split", "fused-polled", "wmma"])
def test_bench_op_old_op_paths_are_usage_errors_naming_the_one_design(name: str) -> None:
    # The sm_90 form is gone (#31): `auto` was its default; only the V100 design is left.
    result = runner.invoke(app, ["bench", "op", "--op-path", name])
    assert result.exit_code == 2, (name, result.output)
    assert f"--op-path '{name}' is gone" in result.output
    assert "V100 design" in result.output


@pytest.mark.parametrize("args", [["--format", "5byte"], ["--op-path", "auto"]])
def test_bench_op_json_usage_failure_prints_one_error_document(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "qpnserve", "bench", "op", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    document = json.loads(result.stdout)  # exactly one document: json.loads rejects more
    assert set(document) == ERROR_KEYS
    assert (document["kind"], document["command"], document["exit_code"]) == (
        "qpnserve.error",
        "bench op",
        2,
    )
    assert result.stderr.startswith("error: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_bench_op_without_gpu_fails_with_a_hint_not_a_traceback() -> None:
    result = runner.invoke(app, ["bench", "op"])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output
    assert "Traceback" not in result.output


_WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv[0] = 'qpnserve'; "
    "from qpnserve.cli import main; main()"
)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_bench_op_without_torch_is_one_line_and_exit_3(as_json: bool) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "bench", "op", *(["--json"] if as_json else [])],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0] == (
        "error: torch is not installed in this Python, so bench op cannot run"
    )
    if as_json:
        document = json.loads(result.stdout)
        assert (document["kind"], document["exit_code"]) == ("qpnserve.error", 3)
    else:
        assert result.stdout == ""


def test_the_v100_design_on_another_gpu_is_labelled_not_a_v100_speed() -> None:
    from qpnserve.benchop.cuda import design_label

    label = design_label("NVIDIA H200", (9, 0))
    assert label.startswith("op: the V100 design on an NVIDIA H200")
    assert "not a V100 speed" in label


def test_the_v100_design_on_a_v100_carries_no_caveat() -> None:
    from qpnserve.benchop.cuda import design_label

    label = design_label("Tesla V100-PCIE-32GB", (7, 0))
    assert label == "op: the V100 design on a Tesla V100-PCIE-32GB"
