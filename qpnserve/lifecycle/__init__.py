"""The server lifecycle stages: `up`, `down`, `status`, `rollback`.

The CLI (cli/server.py) and `bench ab` call these. They raise QpnErrors and report progress
through a callback (default: stderr); they never print data.

``UpOptions`` is a ``ServerSpec`` (qpnserve/server_spec.py: route, plugin, model, served name,
TP, host, port, extra args, server module), the record the desired and running states share,
plus how to start it (deadlines, detach, the API key); ``model`` is text, ``model_dir`` a Path.

Every stage takes ``settings`` (qpnserve.config.Settings, read by the caller's edge) as a
keyword.

- ``up(opts: UpOptions, progress=None, stages=None, *, settings) -> RunningState``: detached,
  returns once ready; foreground, returns after `qpnserve down` stopped the server
  (KeyboardInterrupt after stopping the group on Ctrl-C/SIGTERM; ServerError if the server
  exits on its own).
- ``resolve_up_options(model=, awq_m1=, settings=, **fields) -> (UpOptions, note)``: the user's
  options, with the route and model the desired state records where the user left them out.
- ``dry_run(opts, progress=None, stages=None, *, settings) -> DryRun``: `up`'s checks before the
  start and its plan with what the route means on the installed host; the error `up` would stop
  with is returned, not raised.
- ``down(timeout_s=DEFAULT_STOP_TIMEOUT_S, progress=None, *, settings) -> DownResult``
- ``status(probe_timeout_s=2.0, *, settings) -> StatusReport``
- ``rollback(restart=False, unpatch=False, stop_timeout_s=DEFAULT_STOP_TIMEOUT_S,
  up_timeout_s=DEFAULT_UP_TIMEOUT_S, progress=None, stages=None, *, settings)
  -> RollbackResult``
  (the DEFAULT_* values are qpnserve.config's)

Locking: the state lock is held only for short read-modify-write sections (check-and-start,
record ready, mark stopping, clear), never while a model loads, so `status` and `down` work
from another terminal while `up` waits.
"""

from __future__ import annotations

from qpnserve.host import HostInfo
from qpnserve.lifecycle.control import (
    DownResult,
    StatusReport,
    down,
    restart_command,
    restart_decision,
    status,
    up_argv,
)
from qpnserve.lifecycle.options import Progress, UpOptions, resolve_up_options, stderr_progress
from qpnserve.lifecycle.plan import LaunchPlan, plan_launch
from qpnserve.lifecycle.preview import DryRun, PlanView, dry_run
from qpnserve.lifecycle.rollback import RollbackResult, rollback
from qpnserve.lifecycle.stages import Stages, default_stages
from qpnserve.lifecycle.up import up

__all__ = [
    "DownResult",
    "DryRun",
    "HostInfo",
    "LaunchPlan",
    "PlanView",
    "Progress",
    "RollbackResult",
    "Stages",
    "StatusReport",
    "UpOptions",
    "default_stages",
    "down",
    "dry_run",
    "plan_launch",
    "resolve_up_options",
    "restart_command",
    "restart_decision",
    "rollback",
    "status",
    "stderr_progress",
    "up",
    "up_argv",
]
