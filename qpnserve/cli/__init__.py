"""Command-line entry point. Each command module registers itself on the shared app.

Command modules keep heavy imports (pydantic models, torch, httpx) inside the command bodies so
``qpnserve --help`` stays fast.
"""

from __future__ import annotations

from qpnserve.cli import bench, bench_op, build, check, fixture, server  # noqa: F401  (registers commands)
from qpnserve.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
