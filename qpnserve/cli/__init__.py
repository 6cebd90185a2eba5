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
from qpnserve.cli.app import app
from qpnserve.errors import exit_codes_epilog


def _add_exit_codes(typer_app: typer.Typer) -> None:
    """Every command's --help ends with the exit codes (one definition: errors.py)."""
    for command in typer_app.registered_commands:
        command.epilog = command.epilog or exit_codes_epilog()
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _add_exit_codes(group.typer_instance)


_add_exit_codes(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
