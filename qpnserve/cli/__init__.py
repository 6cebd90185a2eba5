"""Command-line entry point. Each command module registers itself on the shared app.

Command modules keep heavy imports (pydantic models, torch, httpx) inside the command bodies so
``qpnserve --help`` stays fast.
"""

from __future__ import annotations

import typer

from qpnserve.cli import (  # noqa: F401  (registers commands)
    bench,
    bench_op,
    build,
    check,
    fixture,
    report,
    server,
    verify,
)
from qpnserve.cli.app import COMMAND_NAME, app
from qpnserve.errors import exit_codes_epilog


def _finish_commands(typer_app: typer.Typer, prefix: str = "") -> None:
    """Every command's --help ends with the exit codes (one definition: errors.py); every
    callback learns its name as typed (e.g. "bench op"), for its --json error document."""
    for command in typer_app.registered_commands:
        command.epilog = command.epilog or exit_codes_epilog()
        if command.callback is not None:  # typer's rule for an unnamed command: dashes
            name = command.name or command.callback.__name__.lower().replace("_", "-")
            setattr(command.callback, COMMAND_NAME, prefix + name)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _finish_commands(group.typer_instance, f"{prefix}{group.name} ")


_finish_commands(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
