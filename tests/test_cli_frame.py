"""The CLI frame: version, help, and the promise that help/import stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from qpnserve import __version__
from qpnserve.cli import app
from qpnserve.cli.app import handles_errors
from qpnserve.errors import EXIT_CODE_MEANINGS, ExitCode, StateError, exit_codes_markdown

runner = CliRunner()


def test_version_prints_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"qpnserve {__version__}"


def test_help_and_import_do_not_load_torch_or_vllm() -> None:
    code = (
        "import sys\n"
        "from qpnserve.cli import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "mods = ('torch', 'vllm', 'pynvml', 'safetensors')\n"
        "heavy = sorted(m for m in mods if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_library_error_becomes_one_line_message_and_exit_code(capsys) -> None:
    @handles_errors
    def broken() -> None:
        raise StateError("state file server.json is corrupt", hint="delete it")

    try:
        broken()
    except BaseException as exc:  # typer.Exit
        assert getattr(exc, "exit_code", None) == int(ExitCode.STATE)
    else:
        raise AssertionError("expected an exit")
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: state file server.json is corrupt", "hint: delete it"]


def _command_paths() -> list[list[str]]:
    """Every leaf command, as the argv that reaches it (e.g. ["bench", "smoke"])."""
    import typer.main

    def walk(command: Any, path: list[str]) -> list[list[str]]:
        subcommands = getattr(command, "commands", None)  # a group (typer vendors click)
        if subcommands:
            return [p for name, sub in subcommands.items() for p in walk(sub, [*path, name])]
        return [path]

    return walk(typer.main.get_command(app), [])


def test_every_command_lists_every_exit_code_in_its_help() -> None:
    paths = _command_paths()
    assert ["up"] in paths and ["bench", "smoke"] in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, path
        help_text = result.stdout
        assert "Exit codes:" in help_text, path
        for code, meaning in EXIT_CODE_MEANINGS.items():
            assert f"{int(code):>3}  {meaning}" in help_text, (path, code)


def test_readme_exit_code_table_is_the_one_definition() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Exit codes") :]
    table_end = next(i for i, ln in enumerate(section.splitlines()[1:]) if ln.startswith("## "))
    rows = [ln for ln in section.splitlines()[1 : table_end + 1] if ln.startswith("|")]
    assert "\n".join(rows) == exit_codes_markdown()
    assert set(EXIT_CODE_MEANINGS) == set(ExitCode)
