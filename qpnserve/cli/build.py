"""`qpnserve build`: compile the AWQ M1 operator against the installed torch, or reuse the cache.

Exit codes: 0 built or reused, 2 a bad option (e.g. --arch), 3 the toolkit/torch cannot build it
or the compiler failed. With --json, stdout holds exactly one document, a failure's too
(cli.app.error_document).
"""

from __future__ import annotations

import typer

from qpnserve.cli.app import app, emit_json, handles_errors, message, settings


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
