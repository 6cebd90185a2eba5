"""`qpnserve bench op` command line: bad options and a machine without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from qpnserve.cli import app

runner = CliRunner()


def test_bench_op_rejects_unknown_format_with_usage_exit() -> None:
    result = runner.invoke(app, ["bench", "op", "--format", "5byte"])
    assert result.exit_code == 2
    assert "--format must be 4byte or 3byte" in result.output


def test_bench_op_rejects_unknown_op_path() -> None:
    result = runner.invoke(app, ["bench", "op", "--op-path", "wmma"])
    assert result.exit_code == 2
    assert "--op-path" in result.output


def test_op_path_names_of_the_cli_are_the_paths_the_benchmark_knows() -> None:
    from qpnserve.benchop.cuda import OP_PATHS
    from qpnserve.cli.bench_op import OP_PATH_NAMES

    assert set(OP_PATH_NAMES) == set(OP_PATHS)


def test_bench_op_rejects_zero_layers() -> None:
    result = runner.invoke(app, ["bench", "op", "--layers", "0"])
    assert result.exit_code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_bench_op_without_gpu_fails_with_a_hint_not_a_traceback() -> None:
    result = runner.invoke(app, ["bench", "op"])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output
    assert "Traceback" not in result.output


def test_bench_op_rejects_the_removed_tuning_paths() -> None:
    for name in ("mma884", "polled", "split", "fused-polled"):
        result = runner.invoke(app, ["bench", "op", "--op-path", name])
        assert result.exit_code == 2, (name, result.output)
        assert "auto, v100" in result.output


def test_v100_design_pinned_on_another_gpu_is_labelled_not_a_v100_speed() -> None:
    from qpnserve.benchop.cuda import pinned_path_label

    label = pinned_path_label("v100", "NVIDIA H200", (9, 0))
    assert label == "op: the V100 design on an NVIDIA H200 (not a V100 speed)"


def test_v100_design_on_a_v100_is_labelled_as_its_default() -> None:
    from qpnserve.benchop.cuda import pinned_path_label

    label = pinned_path_label("v100", "Tesla V100-PCIE-32GB", (7, 0))
    assert label is not None and "default" in label and "not a V100" not in label


def test_the_default_path_gets_no_v100_label() -> None:
    from qpnserve.benchop.cuda import OP_PATHS, pinned_path_label

    assert OP_PATHS == {"auto": 0, "v100": 1}
    assert pinned_path_label("auto", "NVIDIA H200", (9, 0)) is None
