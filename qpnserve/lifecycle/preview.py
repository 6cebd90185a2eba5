"""`up --dry-run`: `up`'s checks before the start, and the plan it would run; nothing is
started or recorded, and the error `up` would stop with is returned for the CLI to exit with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qpnserve import config
from qpnserve.errors import QpnError
from qpnserve.host_profile_preview import ProfilePreview, preview_installed
from qpnserve.lifecycle import stages as stage_defaults
from qpnserve.lifecycle.options import Progress, UpOptions, stderr_progress
from qpnserve.lifecycle.plan import LaunchPlan, plan_launch
from qpnserve.lifecycle.prestart import checks_before_start
from qpnserve.lifecycle.stages import Stages


@dataclass(frozen=True)
class PlanView:
    """The plan as `up --dry-run` shows it: what it runs, and what the route means on the
    installed host (the same wording as `check` and `status`)."""

    plan: LaunchPlan
    host: str  # "ReVolta 0.1.4 (native)", or "no vllm found"
    route: str
    grouped_route: str | None  # a native host's grouped route on the same layers, if any
    host_profile: ProfilePreview | None = None  # what the host's own launch profile will apply
    facts_file: str | None = None  # the $QPNSERVE_FACTS_FILE the host was read from
    speculation: str = ""  # qpnserve.speculation's plain-words line for this launch


@dataclass(frozen=True)
class DryRun:
    view: PlanView
    error: QpnError | None  # what `up` would stop with before starting; None: it would start

    @property
    def plan(self) -> LaunchPlan:
        return self.view.plan


def describe_plan(plan: LaunchPlan, facts_file: Path | None) -> PlanView:
    from qpnserve.host_routes import grouped_route_text, route_flag_meaning
    from qpnserve.preflight.gather import host_facts
    from qpnserve.speculation import describe_launch

    host = host_facts(facts_file)
    kind = host.kind if host.found else None
    route = route_flag_meaning(plan.recorded_env.get(config.ROUTE_FLAG.name), kind)
    label = f"{host.dist_name} {host.version} ({host.kind})" if host.found else "no vllm found"
    profile = preview_installed(host.package_dir if host.found else None, plan.argv, plan.env)
    speculation = describe_launch(plan.argv, plan.env)
    return PlanView(
        plan,
        label,
        route,
        grouped_route_text(plan.recorded_env, kind),
        profile,
        str(facts_file) if facts_file else None,  # what host_facts() read
        speculation,
    )


def dry_run(
    opts: UpOptions,
    progress: Progress | None = None,
    stages: Stages | None = None,
    *,
    settings: config.Settings,
) -> DryRun:
    """`up`'s checks before the start (not the build), and its plan; starts and records nothing."""
    say = progress or stderr_progress
    stages = stages or stage_defaults.default_stages()
    plan = plan_launch(opts, settings.state_dir, base_env=settings.environ)
    error = None
    try:
        checks_before_start(opts, plan.env, say, stages, dry_run=True, settings=settings)
        say("extension: not built in a dry run (`qpnserve build` builds it)")
    except QpnError as exc:
        error = exc
    for line in plan.replaced:
        say(line)
    return DryRun(describe_plan(plan, settings.facts_file), error)
