"""What `up` starts, decided before anything starts: the launch plan (argv, environment, cwd,
log and report paths), the checks of the options, and the state records derived from them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from qpnserve import config
from qpnserve.host import find_package_dir
from qpnserve.host_profile import profile_path
from qpnserve.lifecycle.launch import (
    build_argv,
    build_env,
    default_python,
    installed_general_plugins,
    replaced_env,
    route_env_record,
)
from qpnserve.lifecycle.options import UpOptions, validate
from qpnserve.lifecycle.procs import start_ticks
from qpnserve.state import DesiredState, HostKind, RunningState, logs_dir, report_dir


@dataclass(frozen=True)
class LaunchPlan:
    """What `up` would start: `--dry-run` prints it, `up` runs it."""

    argv: list[str]
    env: dict[str, str]  # the full environment of the server
    recorded_env: dict[str, str | None]  # the variables that decide the route
    cwd: Path
    log_path: Path
    report_dir: Path
    replaced: list[str] = field(default_factory=list)  # the user's values `up` overrides, said


def plan_launch(
    opts: UpOptions,
    root: Path,
    *,
    base_env: Mapping[str, str],
    installed_plugins: Sequence[str] | None = None,
) -> LaunchPlan:
    validate(opts)
    reports = report_dir(root)
    env = build_env(
        base_env,
        awq_m1=opts.awq_m1,
        include_plugin=opts.include_plugin,
        report_dir=reports,
        installed_plugins=(
            installed_general_plugins() if installed_plugins is None else installed_plugins
        ),
    )
    notes = replaced_env(base_env, env)
    if opts.api_key is not None:
        # vLLM lets --api-key win over the variable; moving the key keeps that precedence.
        env[config.API_KEY.name] = opts.api_key
        notes.append(
            f"note: --api-key goes to the server as {config.API_KEY.name} (kept out of its argv, "
            "its log and qpnserve's state)"
        )
    argv = build_argv(
        python=default_python(),
        server_module=opts.module_to_run,
        model=opts.model_dir.resolve(),
        served_model_name=opts.served_name,
        tp=opts.tp,
        host=opts.host,
        port=opts.port,
        extra_args=opts.extra_args,
        host_has_profile=profile_path(find_package_dir()) is not None,
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_path = logs_dir(root) / f"server-{stamp}-{os.getpid()}.log"
    # The host's instructions: run from a directory outside any source checkout, so the
    # checkout's `vllm/` folder cannot shadow the installed package.
    return LaunchPlan(
        argv,
        env,
        route_env_record(env),
        root / "run",
        log_path,
        reports,
        notes,
    )


def starting_state(
    pid: int,
    plan: LaunchPlan,
    opts: UpOptions,
    host_kind: HostKind,
    host_version: str | None,
    build_key: str | None,
    facts_file: str | None = None,
) -> RunningState:
    # What runs, resolved: the checkpoint path absolute, the defaults named.
    resolved = {
        "model": str(opts.model_dir.resolve()),
        "served_model_name": opts.served_name,
        "server_module": opts.module_to_run,
    }
    return RunningState(
        **opts.spec_fields() | resolved,
        phase="starting",
        pid=pid,
        pgid=pid,  # start_new_session: the server leads its own group
        proc_start_ticks=start_ticks(pid),
        started_at=datetime.now(UTC),
        argv=plan.argv,
        env=plan.recorded_env,
        cwd=str(plan.cwd),
        host_kind=host_kind,
        host_version=host_version,
        facts_file=facts_file,
        build_key=build_key,
        log_path=str(plan.log_path),
        report_dir=str(plan.report_dir),
        api_key_set=bool(plan.env.get(config.API_KEY.name)),
    )


def desired_from(opts: UpOptions, api_key_in_env: bool = False) -> DesiredState:
    """``api_key_in_env``: $VLLM_API_KEY is set in the settings the server starts from."""
    return DesiredState(
        **opts.spec_fields() | {"model": str(opts.model_dir.resolve())},  # the default module
        # is recorded as None (DesiredState)
        api_key_set=opts.api_key is not None or api_key_in_env,
    )
