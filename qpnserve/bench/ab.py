"""`bench ab`: the route's effect on this host, measured the way the evidence was.

Route off: start, smoke, stop. Route on: start (up proves every rank admitted every layer),
smoke. Then compare, and put the server back the way it was found: the desired state file
as it was, and a server running only if one was running (with its desired route).

The lifecycle calls are injected (``AbHooks``) so the orchestration is tested without a host;
the defaults are the real qpnserve.lifecycle stages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qpnserve.bench.compare import CompareReport, compare
from qpnserve.bench.models import BenchReport
from qpnserve.bench.smoke import SmokeOptions, SmokeOutcome, run_smoke
from qpnserve.errors import ConflictError, QpnError, StateError

if TYPE_CHECKING:
    from qpnserve.config import Settings
    from qpnserve.lifecycle import StatusReport, UpOptions
    from qpnserve.state import DesiredState, RunningState

Progress = Callable[[str], None]
ARMS: tuple[tuple[str, bool], ...] = (("route-off", False), ("route-on", True))


@dataclass(frozen=True)
class AbOptions:
    up: UpOptions  # awq_m1 and detach are set per arm
    smoke: SmokeOptions  # url and model are filled from each started server
    out_dir: Path


@dataclass
class AbHooks:
    status: Callable[[], StatusReport]
    up: Callable[[UpOptions], RunningState]
    down: Callable[[float], Any]
    smoke: Callable[[SmokeOptions, Progress], SmokeOutcome]
    restore_desired: Callable[[DesiredState | None], None]


@dataclass
class AbResult:
    reports: dict[str, BenchReport]
    comparison: CompareReport
    out_dir: Path


def default_out_dir(state_dir: Path) -> Path:

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return state_dir / "bench" / f"ab-{stamp}"


def _restore_desired(state_dir: Path, desired: DesiredState | None) -> None:
    from qpnserve.state import DESIRED_FILE, ensure_state_dir, locked, write_desired

    root = ensure_state_dir(state_dir)
    with locked(root):
        if desired is not None:
            write_desired(root, desired)
        else:  # there was none: do not leave the last arm's behind as if someone asked for it
            (root / DESIRED_FILE).unlink(missing_ok=True)


def default_hooks(progress: Progress, settings: Settings) -> AbHooks:
    from qpnserve import lifecycle
    from qpnserve.auth import api_key_from_env

    return AbHooks(
        status=lambda: lifecycle.status(settings=settings),
        up=lambda opts: lifecycle.up(opts, progress=progress, settings=settings),
        down=lambda timeout_s: lifecycle.down(timeout_s, progress=progress, settings=settings),
        smoke=lambda opts, say: run_smoke(
            opts, progress=say, api_key=api_key_from_env(settings.environ)
        ),
        restore_desired=lambda desired: _restore_desired(settings.state_dir, desired),
    )


def _found_options(found: StatusReport, base: UpOptions) -> UpOptions | None:
    """The UpOptions that bring back the server found running, or None if none was running."""
    if found.running is None or found.server != "ready":
        return None
    desired, running = found.desired, found.running
    # The desired state is what the user asked for last; the running one fills what it lacks
    # (a model, and the server module, which desired.json records as null for the default).
    fields = (desired or running).spec_fields()
    fields["model"] = fields["model"] or running.model
    fields["server_module"] = fields["server_module"] or running.server_module
    return base.model_copy(update={**fields, "detach": True})


def run_ab(opts: AbOptions, progress: Progress, hooks: AbHooks) -> AbResult:
    """``hooks``: the effects (default_hooks(progress, settings) for the real ones)."""
    found = hooks.status()
    if found.server in ("starting", "stopping"):
        raise ConflictError(
            f"a server is {found.server}; `bench ab` needs to restart it",
            hint="wait for it to settle, or `qpnserve down`",
        )
    found_desired = found.desired
    restore = _found_options(found, opts.up)
    if found.running is not None:
        progress(f"stopping the running server (pid {found.running.pid}) for the A/B")
        hooks.down(opts.up.stop_timeout_s)
    reports: dict[str, BenchReport] = {}
    running_arm: UpOptions | None = None
    try:
        for label, awq_m1 in ARMS:
            arm = opts.up.model_copy(update={"awq_m1": awq_m1, "detach": True})
            if running_arm is not None:
                hooks.down(opts.up.stop_timeout_s)
                running_arm = None
            progress(f"{label}: starting the server with the route {'on' if awq_m1 else 'off'}")
            state = hooks.up(arm)
            running_arm = arm
            smoke_opts = dataclasses.replace(
                opts.smoke, url=state.base_url, model=state.served_model_name, label=label
            )
            outcome = hooks.smoke(smoke_opts, progress)
            outcome.report.server.route = _route_text(hooks, state)
            reports[label] = outcome.report
            _save(opts.out_dir / f"{label}.json", outcome.report)
            if outcome.failure is not None:
                raise outcome.failure
        comparison = compare(
            reports["route-off"],
            reports["route-on"],
            str(opts.out_dir / "route-off.json"),
            str(opts.out_dir / "route-on.json"),
        )
        _save(opts.out_dir / "compare.json", comparison)
    except KeyboardInterrupt:
        if running_arm is not None:
            hooks.down(opts.up.stop_timeout_s)
        hooks.restore_desired(found_desired)
        progress("interrupted: the A/B server was stopped; bring yours back with `qpnserve up`")
        raise
    except QpnError:
        try:
            _put_back(hooks, opts, running_arm, restore, found_desired, progress)
        except QpnError as cleanup:  # the first error is the one to act on; say both
            progress(f"could not put the server back: {cleanup.message}")
        raise
    _put_back(hooks, opts, running_arm, restore, found_desired, progress)
    return AbResult(reports=reports, comparison=comparison, out_dir=opts.out_dir)


def _route_text(hooks: AbHooks, state: RunningState) -> str:
    flag = f"VLLM_SM70_AWQ_QWEN38_QPN_M1={state.route_flag}"
    try:
        text = hooks.status().route_text
    except QpnError:
        text = None
    return f"{flag}; {text}" if text else flag


def _put_back(
    hooks: AbHooks,
    opts: AbOptions,
    running_arm: UpOptions | None,
    restore: UpOptions | None,
    found_desired: DesiredState | None,
    progress: Progress,
) -> None:
    """Leave the server as found. The last arm's server stays up when it is what was running."""
    from qpnserve.lifecycle.up import desired_from

    same = (
        running_arm is not None
        and restore is not None
        and _comparable(desired_from(running_arm)) == _comparable(desired_from(restore))
    )
    if running_arm is not None and not same:
        hooks.down(opts.up.stop_timeout_s)
    if restore is not None and not same:
        progress(f"restarting the server as found (route {'on' if restore.awq_m1 else 'off'})")
        hooks.up(restore)
    hooks.restore_desired(found_desired)


def _comparable(desired: DesiredState) -> dict[str, Any]:
    return desired.model_dump(exclude={"updated_at"})


def _save(path: Path, data: Any) -> None:
    from qpnserve.fsutil import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, data.model_dump_json(indent=2) + "\n", mode=0o644)
    except OSError as exc:
        raise StateError(f"cannot write {path}: {exc.strerror or exc}") from None
