"""Inputs of the lifecycle stages, and the three stages `up` runs before it starts a server
(preflight, host detection, build-or-load of the extension), bundled so tests can replace them.

The defaults are the real stages. Tests that have no GPU and no vLLM replace ``Stages`` (see
tests/lifecycle/); nothing in a user-facing path ever skips or fakes them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qpnserve.errors import PreflightError
from qpnserve.launch import DEFAULT_SERVER_MODULE
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
    server_module: str = DEFAULT_SERVER_MODULE
    poll_s: float = 1.0
    progress_every_s: float = 10.0

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model.resolve().name


@dataclass(frozen=True)
class HostSummary:
    """What `up` records about the host: its kind and version (host.detect_host)."""

    kind: HostKind
    version: str | None


@dataclass
class Stages:
    """The stages before the start. ``prepare_extension`` returns the extension's build key."""

    preflight: Callable[[UpOptions, Progress], None]
    detect_host: Callable[[], HostSummary]
    prepare_extension: Callable[[HostSummary, Progress], str]


def run_preflight_stage(opts: UpOptions, progress: Progress) -> None:
    """`qpnserve check` for this start: any FAIL stops `up` (the route adds its own checks)."""
    from qpnserve.preflight import run_preflight  # type: ignore[attr-defined]  # (in progress)

    progress("preflight: checking the host, the GPUs and the checkpoint")
    report = run_preflight(opts.model, tp=opts.tp, awq_m1=opts.awq_m1)
    if report.ok:
        return
    failed = [r for r in report.results if str(getattr(r.status, "value", r.status)) == "FAIL"]
    first = failed[0] if failed else None
    what = f"{first.group}/{first.name}: {first.reason}" if first else "see `qpnserve check`"
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    raise PreflightError(
        f"preflight failed: {what}{more}",
        hint=(getattr(first, "fix", None) or "run `qpnserve check` for the full report"),
    )


def detect_host_stage() -> HostSummary:
    from qpnserve.host import detect_host

    info = detect_host()
    if info is None:
        return HostSummary(kind="none", version=None)
    return HostSummary(kind=info.kind, version=info.version)


def prepare_extension_stage(host: HostSummary, progress: Progress) -> str:
    """Build the operator extension, or load the cached build: the plugin loads the same one."""
    from qpnserve.kernels.build import build

    progress("extension: building or loading the AWQ M1 operator (cached after the first build)")
    result = build()
    progress(f"extension: {'reused' if result.reused else 'built'} {result.build_key}")
    return str(result.build_key)


def default_stages() -> Stages:
    return Stages(
        preflight=run_preflight_stage,
        detect_host=detect_host_stage,
        prepare_extension=prepare_extension_stage,
    )
