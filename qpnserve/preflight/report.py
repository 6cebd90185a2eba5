"""Check results, the preflight report (the `check --json` schema), and its table rendering."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from qpnserve.config import FACTS_FILE
from qpnserve.preflight.facts import Facts

Group = Literal["gpu", "toolchain", "checkpoint"]
Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
ALL_GROUPS: tuple[Group, ...] = ("gpu", "toolchain", "checkpoint")
SCHEMA_VERSION = 1


class CheckResult(BaseModel):
    group: Group
    name: str  # "<group>.<check>", stable: scripts key on it
    status: Status
    reason: str  # one line: what was found
    fix: str = ""  # one line: what to do about it; empty on PASS and SKIP


def result(name: str, status: Status, reason: str, fix: str = "") -> CheckResult:
    """A result whose group is the prefix of its name ("gpu.count" -> "gpu")."""
    group = name.split(".")[0]
    if group not in ALL_GROUPS:
        raise ValueError(f"check name {name!r} does not start with a group")
    return CheckResult(group=group, name=name, status=status, reason=reason, fix=fix)


class PreflightReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    ok: bool  # no FAIL among the groups that ran
    groups: list[Group]  # the groups that ran; the exit code reflects only these
    tp: int
    awq_m1: bool
    model: str | None
    results: list[CheckResult]
    facts: Facts = Field(description="what the checks were decided on (probed or recorded)")

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = {"PASS": 0, "WARN": 0, "FAIL": 0, "SKIP": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "FAIL"]


def stand_in_note(facts: Facts) -> str | None:
    """One line saying that a facts file, not this machine, gave the machine facts; None when
    they were probed. `check`, `up` and `up --dry-run` say it wherever those facts are used."""
    if facts.source != "recorded":
        return None
    return (
        f"the GPU, toolchain and host facts come from {FACTS_FILE.name}={facts.source_file} "
        "(recorded or hand-written), not probed from this machine"
    )


def make_report(
    results: list[CheckResult],
    facts: Facts,
    groups: list[Group],
    tp: int,
    awq_m1: bool,
    model: str | None,
) -> PreflightReport:
    ok = not any(r.status == "FAIL" for r in results if r.group in groups)
    return PreflightReport(
        ok=ok, groups=groups, tp=tp, awq_m1=awq_m1, model=model, results=results, facts=facts
    )


def render_table(report: PreflightReport) -> str:
    """A plain-text table, one row per check, the fix on an indented line under a non-PASS row
    (like DCGM's diag table, with the remedy beside the failure)."""
    width = max((len(r.name) for r in report.results), default=10)
    lines = []
    for r in report.results:
        lines.append(f"{r.status:<4}  {r.name:<{width}}  {r.reason}")
        if r.fix and r.status in ("FAIL", "WARN"):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    counts = report.counts()
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if not report.ok:
        verdict = "NOT ready"
    elif len(report.groups) == len(ALL_GROUPS):
        verdict = "ready for the AWQ M1 route" if report.awq_m1 else "ready"
    else:
        verdict = "no failures"
    where = "facts file" if report.facts.source == "recorded" else "this machine"
    lines.append("")
    lines.append(f"{verdict} ({summary}; groups: {', '.join(report.groups)}; {where})")
    note = stand_in_note(report.facts)
    if note and set(report.groups) - {"checkpoint"}:
        lines.append(f"note: {note}")
    return "\n".join(lines)
