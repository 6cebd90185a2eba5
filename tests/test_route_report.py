"""The report directory's file format: the plugin writes through it, the lifecycle reads and
clears through it."""

from __future__ import annotations

from pathlib import Path

from qpnserve.route_report import (
    RouteRefusal,
    clear_reports,
    read_refusals,
    read_reports,
    write_refusal,
    write_report,
)
from tests.lifecycle.test_route_check import report


def test_reports_read_back_sorted_by_rank(tmp_path: Path) -> None:
    write_report(tmp_path, report(1))
    write_report(tmp_path, report(0))
    assert [r.tp_rank for r in read_reports(tmp_path)] == [0, 1]


def test_clear_reports_removes_reports_and_refusals_and_keeps_other_files(tmp_path: Path) -> None:
    write_report(tmp_path, report(0))
    write_refusal(tmp_path, RouteRefusal(route_flag="1", process="MainProcess", pid=7, reason="x"))
    other = tmp_path / "server.log"
    other.write_text("kept\n")
    clear_reports(tmp_path)
    assert read_reports(tmp_path) == [] and read_refusals(tmp_path) == []
    assert other.read_text() == "kept\n"
