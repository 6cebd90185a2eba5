"""The two stages `up` runs before it starts a server, bundled so tests can replace them:
the preflight (which also says which host is installed) and build-or-load of the extension.

The defaults are the real stages. Tests that have no GPU and no vLLM replace ``Stages`` (see
tests/lifecycle/); nothing in a user-facing path ever skips or fakes them.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qpnserve import config
from qpnserve.errors import PreflightError
from qpnserve.host import HostInfo
from qpnserve.lifecycle.options import Progress, UpOptions


@dataclass
class Stages:
    """The stages before the start.

    ``preflight(opts, server_env, progress, settings)`` raises PreflightError on any FAIL and
    returns the host it saw (from the preflight's facts, probed or recorded in
    $QPNSERVE_FACTS_FILE, so `up` decides on what `check` saw);
    ``prepare_extension(host, progress, settings)`` returns the extension's build key.
    """

    preflight: Callable[[UpOptions, Mapping[str, str], Progress, config.Settings], HostInfo]
    prepare_extension: Callable[[HostInfo, Progress, config.Settings], str]


def run_preflight_stage(
    opts: UpOptions, server_env: Mapping[str, str], progress: Progress, settings: config.Settings
) -> HostInfo:
    """`qpnserve check` for this start: any FAIL stops `up` (the route adds its own checks).

    The environment checks judge ``server_env``, the environment the server will get (`up`
    sets the route flag and VLLM_PLUGINS itself; everything else the server inherits).
    """
    from qpnserve.preflight import run_preflight
    from qpnserve.preflight.report import stand_in_note

    progress("preflight: checking the GPUs, the toolchain, the host and the checkpoint")
    report = run_preflight(
        opts.model_dir,
        settings=settings,
        tp=opts.tp,
        awq_m1=opts.awq_m1,
        environ=server_env,
        server_args=opts.extra_args,
    )
    note = stand_in_note(report.facts)
    if note:
        progress(f"preflight: {note}")
    failed = report.failed()
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        check = ["qpnserve", "check", "--model", str(opts.model)]
        check += ["--tp", str(opts.tp)] if opts.tp != config.DEFAULT_TP else []
        check += [] if opts.awq_m1 else ["--no-awq-m1"]
        every = f"all {len(failed)} FAILs" if len(failed) > 1 else "the full report"
        raise PreflightError(
            f"preflight failed: {first.name}: {first.reason}{more}",
            hint=f"{first.fix + '; ' if first.fix else ''}{every}: `{shlex.join(check)}`",
            report=report,
        )
    host = report.facts.host
    found = host if host is not None and host.found else HostInfo(found=False)
    return found.model_copy(update={"facts_file": report.facts.source_file})


def prepare_extension_stage(host: HostInfo, progress: Progress, settings: config.Settings) -> str:
    """Build the operator for $QPNSERVE_BUILD_ARCH (else the visible GPUs), or reuse the cached
    build with the same key; the plugin in every worker loads that build (it never compiles)."""
    from qpnserve.kernels.build import build

    arch = settings.build_arch
    progress(
        "extension: building or reusing the AWQ M1 operator for "
        + (f"{config.BUILD_ARCH.name}={arch}" if arch else "the visible GPUs")
    )
    result = build(arch_list=arch, progress=progress, build_dir=settings.build_dir)
    progress(f"extension: {'reused' if result.reused else 'built'} {result.build_key}")
    return result.build_key


def default_stages() -> Stages:
    return Stages(preflight=run_preflight_stage, prepare_extension=prepare_extension_stage)
