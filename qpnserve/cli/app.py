"""The typer app and the CLI conventions every command shares.

- data goes to stdout (``--json`` prints one JSON document), messages to stderr;
- the library raises QpnError subclasses; only here do they become a one-line message, a
  one-line hint and a documented exit code (errors.ExitCode), never a traceback;
- the settings (qpnserve.config) are read here, once per invocation, in the root callback that
  runs before every command (also under typer's CliRunner, which never calls ``main``); a
  command takes them with ``settings(ctx)`` and passes them down.
- with ``--json``, a command that stops before printing its own document prints the one error
  document (error_document), so stdout always holds exactly one JSON document.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import typer

from qpnserve import __version__
from qpnserve.config import VERIFY_CAPTURE_DIR, Settings, load_settings, with_environ
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


# The running command's name as typed, e.g. "bench smoke"; cli/__init__.py names each command
# once all are registered (COMMAND_NAME on its callback), handles_errors sets it per call.
COMMAND_NAME = "qpnserve_command"
_running_command: ContextVar[str | None] = ContextVar(COMMAND_NAME, default=None)

# JSON documents this process has printed: handles_errors prints the error document only when
# the failing command has printed none (a partial report or a preflight report is the document).
_documents_printed = 0


def emit_json(data: Any) -> None:
    """One JSON document on stdout. Accepts pydantic models, dicts and lists."""
    global _documents_printed
    _documents_printed += 1
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


def error_document(exc: QpnError | KeyboardInterrupt, **extra: Any) -> dict[str, Any]:
    """The one JSON document `--json` prints when a command stops without a document of its own:
    the same error, hint and exit code as on stderr (docs/commands.md, "JSON on failure")."""
    if isinstance(exc, QpnError):
        code, text, hint = exc.exit_code, exc.message, exc.hint
    else:  # Ctrl-C: what handles_errors turns into exit 130
        code, text, hint = ExitCode.INTERRUPTED, "interrupted", None
    return {"kind": "qpnserve.error", "ok": False, "command": _running_command.get(),
            "exit_code": int(code), "error": text, "hint": hint, **extra}  # fmt: skip


@contextlib.contextmanager
def json_failures(as_json: bool, **extra: Any) -> Iterator[None]:
    """For a command whose error document carries more keys (e.g. `bench ab`'s out_dir): print
    it here; handles_errors then sees a document printed and adds none."""
    try:
        yield
    except (QpnError, KeyboardInterrupt) as exc:
        if as_json:
            emit_json(error_document(exc, **extra))
        raise


def handles_errors(func: F) -> F:
    """Turn QpnError into message + exit code, and Ctrl-C into exit 130, for one command; with
    --json, also print the error document unless the command printed a document of its own."""
    json_flags = [
        name
        for name, param in inspect.signature(func).parameters.items()
        if "--json" in (getattr(param.default, "param_decls", None) or ())
    ]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        printed_before = _documents_printed
        running = _running_command.set(getattr(wrapper, COMMAND_NAME, None))
        try:
            return func(*args, **kwargs)
        except (QpnError, KeyboardInterrupt) as exc:
            as_json = any(kwargs.get(name) for name in json_flags)
            if as_json and _documents_printed == printed_before:
                emit_json(error_document(exc))
            if isinstance(exc, QpnError):
                raise fail(exc) from None
            message("interrupted")
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        finally:
            _running_command.reset(running)

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
    # $QPNSERVE_VERIFY_CAPTURE_DIR is live verify's hand-off to the server it starts (verify
    # sets it itself); one exported in the shell would make every server qpnserve starts wrap the
    # host's hook and capture, so the CLI never passes it on.
    ctx.obj = with_environ(load_settings(), {VERIFY_CAPTURE_DIR.name: None})


def settings(ctx: typer.Context) -> Settings:
    """The settings the root callback read for this invocation."""
    found = ctx.find_root().obj
    if not isinstance(found, Settings):  # a command invoked without the app's root callback
        raise RuntimeError("qpnserve's settings are read by the root callback of cli.app")
    return found
