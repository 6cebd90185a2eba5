"""GPU: `verify --offline` with the CUDA extension on the seeded checkpoint (run with -m gpu).

The op has one CUDA form, the V100 design (the kernels an sm_70 build runs; m8n8k4 is emulated on
newer GPUs): 2 layers x 3 prefixes x 4 ranks x 2 metadata formats = 48 samples, each within the
contract's bounds against the FP64 reference decoded from the export; and the two deliberately
broken preparations exit 7 naming the broken layer.
Run with: pytest -m gpu tests/verify
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app

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
    assert {s["status"] for s in report["samples"]} == {"within"}
    print(f"\nverify --offline (CUDA, the V100 design): {report['arms']}")


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
