"""The CLI frame: version, help, and the promise that help/import stay light."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from qpnserve import __version__
from qpnserve.cli import app
from qpnserve.cli.app import handles_errors
from qpnserve.errors import ExitCode, StateError

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
