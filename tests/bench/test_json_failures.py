"""Every bench subcommand's --json prints exactly one JSON document on stdout, failures
included (#32 defect 4): a report when there is one, else the error's document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app

runner = CliRunner()


def one_document(stdout: str) -> dict[str, object]:
    """json.loads fails on an empty stdout and on two concatenated documents alike."""
    document = json.loads(stdout)
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize(
    ("args", "command", "exit_code", "error_start"),
    [
        (
            ["bench", "smoke", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
            "bench smoke",
            2,
            "--concurrency values must be 1..",
        ),
        (
            ["bench", "ab", "--model", "/nonexistent", "--concurrency", "1,x"],
            "bench ab",
            2,
            "--concurrency must be a comma-separated list of integers",
        ),
    ],
)
def test_json_usage_failure_is_one_error_document(
    args: list[str], command: str, exit_code: int, error_start: str
) -> None:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == exit_code, result.output
    document = one_document(result.stdout)
    keys = {"kind", "ok", "command", "exit_code", "error", "hint"}
    assert set(document) == (keys | {"out_dir"} if command == "bench ab" else keys)
    assert (document["kind"], document["command"]) == ("qpnserve.error", command)
    assert document["exit_code"] == exit_code
    assert str(document["error"]).startswith(error_start)
    assert result.stderr.startswith(f"error: {error_start}")


def test_json_compare_of_a_missing_file_is_one_error_document(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    result = runner.invoke(app, ["bench", "compare", str(missing), str(missing), "--json"])
    assert result.exit_code == 2, result.output
    document = one_document(result.stdout)
    assert (document["kind"], document["command"]) == ("qpnserve.error", "bench compare")
    assert str(document["error"]).startswith(f"cannot read {missing}")


def test_without_json_a_failure_leaves_stdout_empty(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    result = runner.invoke(app, ["bench", "compare", str(missing), str(missing)])
    assert result.exit_code == 2
    assert result.stdout == ""
