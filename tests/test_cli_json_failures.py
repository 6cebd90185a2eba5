"""Every command's --json prints exactly one JSON document on stdout when it fails without a
report of its own: the error document, the same for all commands (docs/commands.md)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from qpnserve.cli import app

runner = CliRunner()

ERROR_KEYS = {"kind", "ok", "command", "exit_code", "error", "hint"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


# (argv before --json, the command's name in the document, exit code, start of the error)
CASES = [
    (["build", "--arch", "volta"], "build", 2, "unknown CUDA arch 'volta'"),
    (["bench", "op", "--format", "5byte"], "bench op", 2, "--format must be 4byte or 3byte"),
    (
        ["bench", "smoke", "--url", "URL", "--concurrency", "1"],
        "bench smoke",
        5,
        "no OpenAI-compatible server answers at",
    ),
    (["bench", "compare", "MISSING", "MISSING"], "bench compare", 2, "cannot read"),
    (
        ["bench", "ab", "--model", "MISSING", "--concurrency", "1,x"],
        "bench ab",
        2,
        "--concurrency must be a comma-separated list of integers",
    ),
    (["up"], "up", 6, "state file"),
    (["down"], "down", 6, "state file"),
    (["status"], "status", 6, "state file"),
    (["rollback"], "rollback", 6, "state file"),
    (["verify"], "verify", 2, "missing --model"),
    (["check", "--tp", "0"], "check", 2, "--tp must be >= 1"),
    (["report", "--log-lines", "-1"], "report", 2, "--log-lines must be >= 0"),
    (["fixture", "checkpoint"], "fixture checkpoint", 2, "missing OUT directory"),
    (["fixture", "tiny-model", "FULL"], "fixture tiny-model", 2, "FULL"),
]


def _commands_with_json(group: Any, prefix: str = "") -> set[str]:
    found = set()
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(command, "commands"):  # a group (typer's own click classes)
            found |= _commands_with_json(command, path + " ")
        elif any("--json" in getattr(p, "opts", ()) for p in command.params):
            found.add(path)
    return found


def test_every_command_with_json_is_driven_into_a_failure_below() -> None:
    assert _commands_with_json(typer.main.get_command(app)) == {case[1] for case in CASES}


@pytest.mark.parametrize(
    ("argv", "command", "exit_code", "words"), CASES, ids=[c[1] for c in CASES]
)
def test_json_failure_is_one_error_document(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    command: str,
    exit_code: int,
    words: str,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for name in ("desired.json", "server.json"):  # up, down, status, rollback: unreadable state
        (state / name).write_text("{not json")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    monkeypatch.setenv("QPNSERVE_STATE_DIR", str(state))
    monkeypatch.delenv("QPNSERVE_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    where = {
        "URL": f"http://127.0.0.1:{_closed_port()}",
        "MISSING": str(tmp_path / "missing"),
        "FULL": str(full),
    }
    result = runner.invoke(app, [*(where.get(a, a) for a in argv), "--json"])
    assert result.exit_code == exit_code, result.output
    document = json.loads(result.stdout)  # fails on an empty stdout and on two documents alike
    assert set(document) - {"out_dir", "verdict"} == ERROR_KEYS
    assert (document["kind"], document["ok"], document["command"]) == (
        "qpnserve.error",
        False,
        command,
    )
    assert document["exit_code"] == exit_code
    assert words.replace("FULL", where["FULL"]) in document["error"]
    assert result.stderr.startswith(f"error: {document['error']}")
