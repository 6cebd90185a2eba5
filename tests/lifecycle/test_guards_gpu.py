"""On a real GPU (run with -m gpu): `check` and `up` name, by pid, a process this test started
that holds GPU memory; NVML, not a stand-in, says who holds what."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HOLD_MIB = 1024
HOLDER = (
    "import time, torch\n"
    f"x = torch.empty({HOLD_MIB} * 2**20, dtype=torch.uint8, device='cuda:0')\n"
    "torch.cuda.synchronize()\n"
    "print('held', flush=True)\n"
    "time.sleep(300)\n"
)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    yield proc
    proc.kill()
    proc.wait()


def _qpnserve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QPNSERVE_") and k != "CUDA_VISIBLE_DEVICES"
    }
    env["QPNSERVE_STATE_DIR"] = str(tmp_path / "state")
    return subprocess.run(
        [sys.executable, "-m", "qpnserve", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_check_names_a_process_holding_gpu_memory_by_pid(
    holder: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    done = _qpnserve(["check", "--only", "gpu", "--tp", "1", "--json"], tmp_path)
    rows = {r["name"]: r for r in json.loads(done.stdout)["results"]}
    row = rows["gpu.leftover_processes"]
    assert row["status"] == "FAIL", row
    assert f"pid {holder.pid} (" in row["reason"], row
    assert "on GPU 0" in row["reason"], row
    assert row["fix"].startswith("stop them: kill "), row


def test_up_refuses_to_start_on_a_gpu_another_process_holds(
    holder: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    done = _qpnserve(
        ["up", "--dry-run", "--no-awq-m1", "--tp", "1", "--model", str(model)], tmp_path
    )
    assert done.returncode == 4, done.stderr
    assert f"pid {holder.pid} (" in done.stderr
    assert "on GPU 0" in done.stderr
