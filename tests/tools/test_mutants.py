"""tools/mutants: the fault table cannot rot silently (the run itself is too slow for CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.mutant_table import FAULTS, Fault
from tools.mutants import stale

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_still_applies_and_its_tests_exist(fault: Fault) -> None:
    assert stale(fault, ROOT) is None
    assert fault.new != fault.old
    for selection in fault.tests:
        assert (ROOT / selection.split("::")[0]).exists(), selection


def test_fault_ids_are_unique_and_the_table_is_the_issues_size() -> None:
    ids = [f.id for f in FAULTS]
    assert len(ids) == len(set(ids))
    assert len([f for f in FAULTS if not f.needs_gpu]) >= 24  # issue 32's run had 24


def test_list_prints_every_fault_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.mutants", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = [ln for ln in done.stdout.splitlines() if ln and not ln.startswith(" ")]
    assert listed[:-1] == [
        f.id + (" [needs GPU, not run here]" if f.needs_gpu else "") for f in FAULTS
    ]
    assert listed[-1] == f"{len(FAULTS)} faults (1 need a GPU)"


def test_stale_says_when_the_old_text_is_gone(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1\na = 1\n")
    fault = Fault("x", "m.py", "a = 1", "a = 2", ("t",), "why")
    assert stale(fault, tmp_path) == "its old text occurs 2 times in m.py (needs exactly 1)"
    assert stale(Fault("y", "gone.py", "a", "b", ("t",), "why"), tmp_path) == (
        "gone.py does not exist"
    )
