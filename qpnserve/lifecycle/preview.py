"""`up --dry-run`: `up`'s checks before the start, and the plan it would run; nothing is
started or recorded, and the error `up` would stop with is returned for the CLI to exit with."""

from __future__ import annotations

from dataclasses import dataclass

from qpnserve import config
from qpnserve.errors import QpnError
from qpnserve.lifecycle import stages as stage_defaults
from qpnserve.lifecycle.options import Progress, UpOptions, stderr_progress
from qpnserve.lifecycle.plan import LaunchPlan, plan_launch
from qpnserve.lifecycle.stages import Stages
from qpnserve.lifecycle.up import checks_before_start


@dataclass(frozen=True)
class DryRun:
    plan: LaunchPlan
    error: QpnError | None  # what `up` would stop with before starting; None: it would start


def dry_run(
    opts: UpOptions, progress: Progress | None = None, stages: Stages | None = None
) -> DryRun:
    """`up`'s checks before the start (not the build), and its plan; starts and records nothing."""
    say = progress or stderr_progress
    stages = stages or stage_defaults.default_stages()
    plan = plan_launch(opts, config.state_dir())
    error = None
    try:
        checks_before_start(opts, plan.env, say, stages, dry_run=True)
        say("extension: not built in a dry run (`qpnserve build` builds it)")
    except QpnError as exc:
        error = exc
    for line in plan.replaced:
        say(line)
    return DryRun(plan, error)
