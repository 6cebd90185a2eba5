"""examples/op_vs_oracle.py: a verdict against the contract's bounds, and no traceback before a
build (#32 defect 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "op_vs_oracle.py"


def _run(build_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, QPNSERVE_BUILD_DIR=str(build_dir))
    return subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=600
    )


def test_example_prints_a_pass_verdict_against_the_contract(cpu_extension) -> None:  # type: ignore[no-untyped-def]
    done = _run(cpu_extension.path.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "out within the contract's bounds: yes (" in done.stdout
    assert "intermediate within the contract's bounds: yes (" in done.stdout
    assert lines[-1] == "verdict: PASS (contract section 4, random x)"


def test_example_before_a_build_is_a_one_line_error_with_the_build_command(tmp_path: Path) -> None:
    done = _run(tmp_path / "no-builds")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    first, hint = done.stderr.splitlines()[:2]
    assert first.startswith("error: no CPU-only build of the operator")
    assert "qpnserve build --cpu-only" in hint
    assert done.stdout == ""
