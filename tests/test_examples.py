"""The examples stay runnable: shell scripts parse, and the operator demo meets the contract."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.sh")), ids=lambda p: p.name)
def test_example_shell_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_op_vs_oracle_example_meets_the_contract_bound_on_cpu(cpu_extension) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, QPNSERVE_BUILD_DIR=str(cpu_extension.path.parent.parent))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "op_vs_oracle.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r"max\|diff\| = (\S+)\s+\(max\|ref\| = (\S+)\)", done.stdout)
    assert match, done.stdout
    diff, ref = float(match.group(1)), float(match.group(2))
    assert ref > 0
    assert diff <= 2e-3 * ref + 2.0**-24  # contract section 4, out bound
