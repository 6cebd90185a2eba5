"""`up --awq-m1 --verify`: verify first, serve only if it passes.

The verification is `verify --offline` over every MoE layer of the checkpoint (all prefixes,
both metadata formats), before anything starts, so a failure leaves no server by construction.
On any verdict but a pass the desired state gets the route off, so the next plain `up` (or
`rollback --restart`) starts without it, and `up` exits: 7 when a sample was outside the
contract, 1 when something was not examined.
"""

from __future__ import annotations

from qpnserve import config
from qpnserve.auth import api_key_from_env
from qpnserve.errors import CanaryError, UsageError
from qpnserve.lifecycle.options import Progress, UpOptions
from qpnserve.lifecycle.plan import desired_from
from qpnserve.state import locked, write_desired
from qpnserve.verify.export import VerifyError
from qpnserve.verify.offline import default_plan, run_offline
from qpnserve.verify.report import VerifyReport


def verify_before_up(
    opts: UpOptions, progress: Progress, *, settings: config.Settings
) -> VerifyReport:
    if not opts.awq_m1:
        raise UsageError("--verify verifies the route; it needs the route on (--awq-m1)")
    if not opts.model_dir.is_dir():
        raise UsageError(f"--model {opts.model} is not a directory", hint="pass the checkpoint dir")
    plan = default_plan(opts.model_dir, None, None, "both", None, "auto")
    from qpnserve.host import detect_host  # the installed files: the converter is loaded from them

    report = run_offline(
        plan, progress, build_dir=settings.build_dir, host=detect_host(), host_env=settings.environ
    )
    if report.verdict == "pass":
        progress(f"verify: {report.summary()}; starting the server")
        return report
    root = settings.state_dir
    with locked(root):
        key_in_env = api_key_from_env(settings.environ) is not None
        write_desired(root, desired_from(opts.model_copy(update={"awq_m1": False}), key_in_env))
    progress("route: off for the next start (desired state saved); no server was started")
    kind = CanaryError if report.verdict == "outside" else VerifyError
    error = kind(
        f"verify before up: {report.summary()}",
        hint="`qpnserve verify --offline --model DIR --json` shows every sample",
    )
    setattr(error, "verify_report", report)  # noqa: B010  (`up --json` prints it)
    raise error
