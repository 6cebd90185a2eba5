"""`up --dry-run`: `up`'s checks before the start, and the plan it would run; nothing is
started or recorded, and the error `up` would stop with is returned for the CLI to exit with."""

from __future__ import annotations

from dataclasses import dataclass

from qpnserve import config
from qpnserve.errors import QpnError
from qpnserve.lifecycle import options
from qpnserve.lifecycle.options import Progress, Stages, UpOptions, stderr_progress
from qpnserve.lifecycle.plan import LaunchPlan, plan_launch, validate
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
    stages = stages or options.default_stages()
    validate(opts)
    error = None
    try:
        checks_before_start(opts, say, stages, dry_run=True)
        say("extension: not built in a dry run (`qpnserve build` builds it)")
    except QpnError as exc:
        error = exc
    plan = plan_launch(opts, config.state_dir())
    for line in plan.replaced:
        say(line)
    return DryRun(plan, error)
