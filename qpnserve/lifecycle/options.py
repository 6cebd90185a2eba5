"""Inputs of the lifecycle stages, and the two stages `up` runs before it starts a server
(preflight, which also says which host is installed; build-or-load of the extension), bundled
so tests can replace them.

The defaults are the real stages. Tests that have no GPU and no vLLM replace ``Stages`` (see
tests/lifecycle/); nothing in a user-facing path ever skips or fakes them.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qpnserve import config
from qpnserve.errors import PreflightError
from qpnserve.state import HostKind

Progress = Callable[[str], None]


def stderr_progress(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@dataclass
class UpOptions:
    """Everything `up` needs. ``detach``: return once ready instead of serving in the foreground."""

    model: Path
    awq_m1: bool = True
    include_plugin: bool = True  # False: leave qpnserve's plugin out (`rollback --unpatch`)
    tp: int = 4
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # None: the checkpoint directory's name
    detach: bool = False
    timeout_s: float = 1800.0  # 4x V100 loads take minutes; CUDA graph capture adds more
    stop_timeout_s: float = 60.0  # grace period of the group stop on failure or Ctrl-C
    extra_args: list[str] = field(default_factory=list)
    server_module: str = config.DEFAULT_SERVER_MODULE
    poll_s: float = 1.0
    progress_every_s: float = 10.0

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model.resolve().name


@dataclass(frozen=True)
class HostSummary:
    """What `up` records about the host: its kind and version, from the preflight's facts
    (probed, or recorded in $QPNSERVE_FACTS_FILE), so `up` decides on what `check` saw."""

    kind: HostKind
    version: str | None


@dataclass
class Stages:
    """The stages before the start.

    ``preflight`` raises PreflightError on any FAIL and returns the host it saw;
    ``prepare_extension`` returns the extension's build key.
    """

    preflight: Callable[[UpOptions, Progress], HostSummary]
    prepare_extension: Callable[[HostSummary, Progress], str]


def run_preflight_stage(opts: UpOptions, progress: Progress) -> HostSummary:
    """`qpnserve check` for this start: any FAIL stops `up` (the route adds its own checks).

    The environment checks judge the server's environment, not the caller's: `up` sets the
    route flag and VLLM_PLUGINS itself, and everything else the server inherits.
    """
    from qpnserve.preflight import run_preflight

    progress("preflight: checking the GPUs, the toolchain, the host and the checkpoint")
    with _environ(_server_overlay(opts)):
        report = run_preflight(opts.model, tp=opts.tp, awq_m1=opts.awq_m1)
    failed = report.failed()
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        check = ["qpnserve", "check", "--model", str(opts.model)]
        check += ["--tp", str(opts.tp)] if opts.tp != 4 else []
        check += [] if opts.awq_m1 else ["--no-awq-m1"]
        every = f"all {len(failed)} FAILs" if len(failed) > 1 else "the full report"
        raise PreflightError(
            f"preflight failed: {first.name}: {first.reason}{more}",
            hint=f"{first.fix + '; ' if first.fix else ''}{every}: `{shlex.join(check)}`",
            report=report,
        )
    host = report.facts.host
    if host is None or not host.found:
        return HostSummary(kind="none", version=None)
    return HostSummary(kind=host.kind, version=host.version)


def _server_overlay(opts: UpOptions) -> dict[str, str]:
    from qpnserve.lifecycle.launch import installed_general_plugins, plugin_allow_list

    plugins = plugin_allow_list(
        os.environ.get(config.VLLM_PLUGINS.name),
        include_plugin=opts.include_plugin,
        installed=installed_general_plugins(),
    )
    return {config.ROUTE_FLAG.name: "1" if opts.awq_m1 else "0", config.VLLM_PLUGINS.name: plugins}


@contextlib.contextmanager
def _environ(overlay: dict[str, str]) -> Iterator[None]:
    """os.environ with ``overlay`` applied, restored after (the preflight probes os.environ)."""
    saved = {name: os.environ.get(name) for name in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_extension_stage(host: HostSummary, progress: Progress) -> str:
    """Build the operator for $QPNSERVE_BUILD_ARCH (else the visible GPUs), or reuse the cached
    build with the same key;
    the plugin in every worker loads that build (it never compiles)."""
    from qpnserve.kernels.build import build

    arch = os.environ.get(config.BUILD_ARCH.name) or None
    progress(
        "extension: building or reusing the AWQ M1 operator for "
        + (f"{config.BUILD_ARCH.name}={arch}" if arch else "the visible GPUs")
    )
    result = build(arch_list=arch, progress=progress)
    progress(f"extension: {'reused' if result.reused else 'built'} {result.build_key}")
    return result.build_key


def default_stages() -> Stages:
    return Stages(preflight=run_preflight_stage, prepare_extension=prepare_extension_stage)
