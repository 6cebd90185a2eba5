"""`qpnserve build`: compile the AWQ M1 operator against the installed torch, or reuse the cache.

Exit codes: 0 built or reused, 2 a bad option (e.g. --arch), 3 the toolkit/torch cannot build it
or the compiler failed. With --json, stdout holds exactly one document, a failure's too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import typer

from qpnserve.cli.app import app, emit_json, handles_errors, message, settings


def error_document(command: str, exc: BaseException) -> dict[str, Any]:
    """The one JSON document `--json` prints when a command fails before it has a result (the
    same keys as the server benchmarks' failures: kind qpnserve.error)."""
    from qpnserve.errors import ExitCode, QpnError

    if isinstance(exc, QpnError):
        code, text, hint = exc.exit_code, exc.message, exc.hint
    else:  # KeyboardInterrupt: what handles_errors turns into exit 130
        code, text, hint = ExitCode.INTERRUPTED, "interrupted", None
    return {"kind": "qpnserve.error", "command": command, "exit_code": int(code),
            "error": text, "hint": hint}  # fmt: skip


@contextlib.contextmanager
def json_failures(as_json: bool, command: str) -> Iterator[None]:
    """With --json, a failure inside still leaves exactly one document on stdout: the error's.
    The exception goes on to handles_errors (message on stderr, exit code)."""
    from qpnserve.errors import QpnError

    try:
        yield
    except (QpnError, KeyboardInterrupt) as exc:
        if as_json:
            emit_json(error_document(command, exc))
        raise


@app.command()
@handles_errors
def build(
    ctx: typer.Context,
    arch: str | None = typer.Option(
        None,
        "--arch",
        envvar="QPNSERVE_BUILD_ARCH",
        help="Compute capabilities to compile for, e.g. 7.0 (V100) or '7.0;9.0'. "
        "Default: the visible GPUs'.",
    ),
    force: bool = typer.Option(False, "--force", help="Compile even if a cached build matches."),
    cpu_only: bool = typer.Option(
        False, "--cpu-only", help="Build only the C++ CPU implementation (no CUDA needed)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Compile the operator extension into the cache (keyed by sources, torch, CUDA, archs);
    print its path and whether an existing build was reused. Never run inside a server."""
    from qpnserve.kernels.build import build as build_extension

    with json_failures(as_json, "build"):
        result = build_extension(
            arch_list=arch,
            force=force,
            cpu_only=cpu_only,
            progress=message,
            build_dir=settings(ctx).build_dir,
        )
    if as_json:
        emit_json(result.to_json())
        return
    what = "reused" if result.reused else "built"
    target = (
        "CPU only"
        if not result.with_cuda
        else "sm_" + ",".join(a.replace(".", "") for a in result.arch_list)
    )
    typer.echo(
        f"{what} {result.path} ({target}, torch {result.torch_version}, key {result.build_key})"
    )
