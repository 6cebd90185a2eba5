"""GPU: `verify --offline` with the CUDA extension on the seeded checkpoint (run with -m gpu).

Both CUDA paths: the device's default (what `verify --offline` runs on this GPU) and PATH_V100
(the V100 design, the kernels an sm_70 build runs), each on 2 layers x 3 prefixes x 4 ranks x 2
metadata formats = 48 samples against the FP64 reference decoded from the export; and the two
deliberately broken preparations exit 7 naming the broken layer.
Run with: pytest -m gpu tests/verify
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app
from qpnserve.config import load_settings
from qpnserve.geometry import TP_SIZE
from qpnserve.kernels import ops
from qpnserve.verify.offline import OfflinePlan, run_offline

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_extension")]
runner = CliRunner()


def test_gpu_verify_offline_passes_with_the_cuda_extension(seeded_checkpoint: Path) -> None:
    result = runner.invoke(
        app,
        ["verify", "--offline", "--model", str(seeded_checkpoint), "--device", "cuda", "--json"],
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["operator"].startswith("CUDA extension")
    assert report["counts"] == {"samples": 48, "within": 48, "outside": 0, "refused": 0}
    print(f"\nverify --offline (CUDA, default path): {report['arms']}")


def test_gpu_verify_offline_v100_path_passes(seeded_checkpoint: Path) -> None:
    plan = OfflinePlan(
        model=seeded_checkpoint,
        layers=[0, 1],
        prefixes=[0, 1, 2],
        meta_formats=["4byte", "3byte"],
        ranks=list(range(TP_SIZE)),
        device="cuda",
        op_path=ops.PATH_V100,
    )
    report = run_offline(plan, progress=print, build_dir=load_settings().build_dir)
    assert report.verdict == "pass", report.summary()
    assert len(report.examined) == 48
    print(f"\nverify --offline (CUDA, PATH_V100): {report.arm_maxima()}")


@pytest.mark.parametrize("fault", ["gate-up-concat", "zero-point-off-by-one"])
def test_gpu_verify_offline_broken_preparation_exits_7_naming_the_layer(
    seeded_checkpoint: Path, fault: str
) -> None:
    result = runner.invoke(
        app,
        ["verify", "--offline", "--model", str(seeded_checkpoint), "--device", "cuda",
         "--prefixes", "0", "--break", fault, "--json"],
    )  # fmt: skip
    assert result.exit_code == 7, result.stderr
    report = json.loads(result.stdout)
    assert report["worst"]["layer"] == 1
    assert {s["status"] for s in report["samples"] if s["layer"] == 0} == {"within"}
