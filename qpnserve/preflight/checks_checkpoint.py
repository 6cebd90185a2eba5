"""The checkpoint checks in their order, and what they mean with the route off.

The checks themselves: checks_config.py (directory, config, quantization) and
checks_tensors.py (shards, expert tensors, coverage).
"""

from __future__ import annotations

from qpnserve.preflight.checks_config import check_config, check_path, check_quantization
from qpnserve.preflight.checks_tensors import check_coverage, check_shards, check_tensors
from qpnserve.preflight.facts import CheckpointFacts
from qpnserve.preflight.report import CheckResult
from qpnserve.preflight.report import result as _r

# What only the route needs from a checkpoint: a server without the route loads any model the
# host can serve, so with the route off these become warnings.
ROUTE_ONLY_CHECKS = (
    "checkpoint.config",
    "checkpoint.quantization",
    "checkpoint.tensors",
    "checkpoint.coverage",
)
ROUTE_OFF_FIX = "nothing to do while the route is off: the host serves this checkpoint its own way"


def route_off(result: CheckResult) -> CheckResult:
    """A route-only FAIL, for a start without the route: a WARN that says what it means."""
    if result.name not in ROUTE_ONLY_CHECKS or result.status != "FAIL":
        return result
    return result.model_copy(
        update={
            "status": "WARN",
            "reason": f"the route cannot serve this checkpoint: {result.reason}",
            "fix": ROUTE_OFF_FIX,
        }
    )


def checkpoint_checks(
    ck: CheckpointFacts | None, tp: int, awq_m1: bool = True
) -> list[CheckResult]:
    """Every checkpoint check; ``awq_m1=False`` (a start without the route) turns the route's
    requirements into warnings, while a checkpoint the host cannot read still fails."""
    results = _all_checkpoint_checks(ck, tp)
    return results if awq_m1 else [route_off(r) for r in results]


def _all_checkpoint_checks(ck: CheckpointFacts | None, tp: int) -> list[CheckResult]:
    first = check_path(ck)
    rest = [
        "checkpoint.config",
        "checkpoint.quantization",
        "checkpoint.shards",
        "checkpoint.tensors",
        "checkpoint.coverage",
    ]
    if ck is None or first.status != "PASS":
        why = "no --model given" if ck is None else "needs a readable checkpoint directory"
        return [first, *(_r(n, "SKIP", why) for n in rest)]
    return [
        first,
        check_config(ck, tp),
        check_quantization(ck),
        check_shards(ck),
        check_tensors(ck),
        check_coverage(ck),
    ]
