"""$QPNSERVE_FACTS_FILE stands in for this machine only with the facts it holds: a file that
holds none of what a group needs is an error, never a pass, and every report made from one says
which file it came from."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from qpnserve.cli import app
from tests.preflight.conftest import V100_OK


def check(facts: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["check", *args], env={"QPNSERVE_FACTS_FILE": str(facts)})


def _facts(tmp_path: Path, **keep: bool) -> Path:
    """The healthy V100 facts with only the objects named in ``keep`` left in."""
    recorded = json.loads(V100_OK.read_text())
    for key in ("gpu", "torch", "nvcc", "host"):
        if not keep.get(key):
            recorded.pop(key)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(recorded))
    return path


@pytest.mark.parametrize("as_json", [False, True])
def test_check_refuses_a_facts_file_that_holds_no_facts(tmp_path: Path, as_json: bool) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    result = check(empty, *(["--json"] if as_json else []))
    assert result.exit_code == 2, result.output
    assert "ready" not in result.output and "PASS" not in result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: QPNSERVE_FACTS_FILE={empty} holds no ")
    for missing in ("gpu", "torch", "nvcc", "host"):
        assert missing in first


def test_check_names_the_facts_a_partial_file_lacks(tmp_path: Path) -> None:
    result = check(_facts(tmp_path, gpu=True, torch=True))
    assert result.exit_code == 2, result.output
    first = result.stderr.splitlines()[0]
    assert "holds no nvcc, host facts" in first
    assert "gpu" not in first.split("holds no ", 1)[1]


def test_check_of_a_group_the_file_does_hold_runs(tmp_path: Path) -> None:
    result = check(_facts(tmp_path, gpu=True), "--only", "gpu")
    assert result.exit_code == 0, result.output
    assert "PASS  gpu.count" in result.stdout


def test_check_only_checkpoint_needs_no_machine_facts(
    tmp_path: Path, make_ckpt: Callable[..., Path]
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    result = check(empty, "--only", "checkpoint", "--model", str(make_ckpt("ok", layers=1)))
    assert result.exit_code == 0, result.output
