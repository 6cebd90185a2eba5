"""The typer app and the CLI conventions every command shares.

- data goes to stdout (``--json`` prints one JSON document), messages to stderr;
- the library raises QpnError subclasses; only here do they become a one-line message, a
  one-line hint and a documented exit code (errors.ExitCode), never a traceback;
- the settings (qpnserve.config) are read here, once per invocation, in the root callback that
  runs before every command (also under typer's CliRunner, which never calls ``main``); a
  command takes them with ``settings(ctx)`` and passes them down.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from qpnserve import __version__
from qpnserve.config import Settings, load_settings
from qpnserve.errors import ExitCode, QpnError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="qpnserve",
    help="Preflight, build, launch, verify, benchmark and roll back the AWQ M1 decode route "
    "of 1Cat-vLLM on 4x Tesla V100.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help text: rich's markdown renderer costs ~50 ms of imports on every --help.
    rich_markup_mode=None,
)
bench_app = typer.Typer(
    help="Benchmarks: the operator (`op`), the server (`smoke`, `ab`), and `compare`.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def message(text: str) -> None:
    """A human message: always stderr, so stdout stays machine-readable."""
    typer.echo(text, err=True)


def emit_json(data: Any) -> None:
    """One JSON document on stdout. Accepts pydantic models, dicts and lists."""
    if hasattr(data, "model_dump_json"):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(data, indent=2, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def fail(exc: QpnError) -> typer.Exit:
    message(f"error: {exc.message}")
    if exc.hint:
        message(f"hint: {exc.hint}")
    return typer.Exit(int(exc.exit_code))


def handles_errors(func: F) -> F:
    """Turn QpnError into message + exit code, and Ctrl-C into exit 130, for one command."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except QpnError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            message("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    return wrapper  # type: ignore[return-value]


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"qpnserve {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """qpnserve: the AWQ M1 decode route for 1Cat-vLLM on 4x V100."""
    ctx.obj = load_settings()


def settings(ctx: typer.Context) -> Settings:
    """The settings the root callback read for this invocation."""
    found = ctx.find_root().obj
    if not isinstance(found, Settings):  # a command invoked without the app's root callback
        raise RuntimeError("qpnserve's settings are read by the root callback of cli.app")
    return found
