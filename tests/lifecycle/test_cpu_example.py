"""examples/try_lifecycle_on_cpu.sh never touches the operator's own server: its state folder
is its own from the first line, and its exit trap stops only a server the script started.

The script runs for real (bash), with stand-ins on PATH for python3, pip and qpnserve that log
each qpnserve call with the state folder it would act on; nothing is installed or started.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "try_lifecycle_on_cpu.sh"

# python3 -m venv DIR: a venv whose activate puts the stand-in pip and qpnserve first on PATH.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  echo "export PATH=\\"$FAKE_BIN:\\$PATH\\"" > "$3/bin/activate"
  exit 0
fi
exit 0
"""
FAKE_PIP = """#!/usr/bin/env bash
if [ "$1" = install ] && [ -n "${FAKE_PIP_FAILS:-}" ]; then exit 1; fi
exit 0
"""
# Logs "<state folder>|<args>"; fails the subcommand named by FAKE_QPNSERVE_FAILS.
FAKE_QPNSERVE = """#!/usr/bin/env bash
echo "${QPNSERVE_STATE_DIR:-<default>}|$*" >> "$FAKE_LOG"
if [ "$1" = "${FAKE_QPNSERVE_FAILS:-}" ]; then exit 5; fi
if [ "$1 $2" = "up --awq-m1" ]; then exit 1; fi
exit 0
"""


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _run(tmp_path: Path, **scenario: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the example; return its result and the qpnserve calls as "state|args" lines."""
    fake_bin = tmp_path / "fake-bin"  # what the venv's activate adds
    operator_bin = tmp_path / "operator-bin"  # the operator's own python3 and qpnserve
    for folder in (fake_bin, operator_bin):
        folder.mkdir()
    _write(operator_bin / "python3", FAKE_PYTHON)
    _write(operator_bin / "qpnserve", FAKE_QPNSERVE)
    _write(fake_bin / "pip", FAKE_PIP)
    _write(fake_bin / "qpnserve", FAKE_QPNSERVE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    log = tmp_path / "qpnserve-calls.log"
    log.touch()
    env = {
        "PATH": f"{operator_bin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(temp),
        "FAKE_BIN": str(fake_bin),
        "FAKE_LOG": str(log),
        # The operator's real server is recorded here; the example must never act on it.
        "QPNSERVE_STATE_DIR": str(tmp_path / "operator-state"),
        **scenario,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    return done, log.read_text().splitlines()


def _acts_only_on_its_own_state(calls: list[str], tmp_path: Path) -> None:
    own = str(tmp_path / "tmp") + os.sep
    assert calls, "the example made no qpnserve call"
    for call in calls:
        state = call.split("|", 1)[0]
        assert state.startswith(own), f"acted on {state}, not its own temporary state: {call}"


def test_cpu_example_stops_nothing_when_the_install_fails(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, FAKE_PIP_FAILS="1")
    assert done.returncode != 0
    assert [c for c in calls if c.split("|", 1)[1].startswith("down")] == []


@pytest.mark.parametrize("failing", ["fixture", "bench"])
def test_cpu_example_stops_only_the_server_it_started(tmp_path: Path, failing: str) -> None:
    done, calls = _run(tmp_path, FAKE_QPNSERVE_FAILS=failing)
    assert done.returncode != 0
    _acts_only_on_its_own_state(calls, tmp_path)
    downs = [c for c in calls if c.split("|", 1)[1].startswith("down")]
    started = any(c.split("|", 1)[1].startswith("up ") for c in calls)
    assert started == (failing == "bench")
    assert len(downs) == (1 if started else 0), calls


def test_cpu_example_runs_every_step_against_its_own_state(tmp_path: Path) -> None:
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    _acts_only_on_its_own_state(calls, tmp_path)
    commands = [c.split("|", 1)[1].split()[0] for c in calls]
    assert commands[:3] == ["fixture", "up", "up"]
    assert commands[-3:] == ["rollback", "down", "status"]
