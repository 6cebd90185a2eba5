"""The preflight stage: probe facts once, run pure checks, return a report.

``run_preflight`` is what `qpnserve check` renders and what `qpnserve up` calls before it starts
anything. It never raises for a failed check (a FAIL row is data); it raises a QpnError only
when it cannot run at all (a bad group name, an unreadable $QPNSERVE_FACTS_FILE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from qpnserve import config
from qpnserve.config import Settings
from qpnserve.errors import UsageError
from qpnserve.preflight.checks import machine_checks
from qpnserve.preflight.checks_checkpoint import checkpoint_checks
from qpnserve.preflight.checks_speculation import check_speculation
from qpnserve.preflight.gather import gather_facts
from qpnserve.preflight.report import (
    ALL_GROUPS,
    CheckResult,
    Group,
    PreflightReport,
    make_report,
)

__all__ = ["ALL_GROUPS", "CheckResult", "PreflightReport", "parse_groups", "run_preflight"]


def parse_groups(text: str | None) -> set[str]:
    """ "gpu,toolchain" -> {"gpu", "toolchain"}; None or "" -> every group."""
    if not text:
        return set(ALL_GROUPS)
    groups = {g.strip() for g in text.split(",") if g.strip()}
    unknown = sorted(groups - set(ALL_GROUPS))
    if unknown or not groups:
        raise UsageError(
            f"unknown check group(s): {', '.join(unknown) or repr(text)}",
            hint=f"choose from {','.join(ALL_GROUPS)}",
        )
    return groups


def run_preflight(
    model: Path | None,
    *,
    settings: Settings,
    tp: int = config.DEFAULT_TP,
    groups: set[str] | None = None,
    awq_m1: bool = True,
    facts_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    server_args: Sequence[str] | None = None,
) -> PreflightReport:
    """Probe (or load ``facts_file``, default the settings' $QPNSERVE_FACTS_FILE) and check.

    ``groups`` defaults to all three; ``report.ok`` is True when no check of those groups
    FAILed. ``awq_m1=False`` turns the route-only requirements (a route-capable host, no
    host variable that disables the path, the route's checkpoint contract) into warnings.
    ``environ`` is the environment the environment checks judge (default: the settings');
    `up` passes the server's, and ``server_args`` (its extra arguments) for the speculation
    check.
    """
    chosen: set[str] = set(ALL_GROUPS) if groups is None else set(groups)
    unknown = sorted(chosen - set(ALL_GROUPS))
    if unknown:
        raise UsageError(f"unknown check group(s): {', '.join(unknown)}")
    if tp < 1:
        raise UsageError(f"--tp must be >= 1, got {tp}")
    facts = gather_facts(
        model,
        chosen,
        facts_file=facts_file or settings.facts_file,
        environ=settings.environ if environ is None else environ,
    )
    results = machine_checks(facts, chosen, tp, awq_m1)
    if "toolchain" in chosen:
        results.append(check_speculation(facts, server_args, awq_m1))
    if "checkpoint" in chosen:
        results += checkpoint_checks(facts.checkpoint, tp, awq_m1)
    ran: list[Group] = [g for g in ALL_GROUPS if g in chosen]
    return make_report(
        results, facts, ran, tp=tp, awq_m1=awq_m1, model=str(model) if model else None
    )
