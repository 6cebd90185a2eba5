"""The one line `up` prints when the plugin refused the route and the server stopped: the
refusing process, its pid and its reason, read from the refusal file the plugin wrote.

tests/e2e/test_failures_vllm.py pins the whole line against a real vLLM; this pins the part
`up` composes without a server, so CI without the e2e extra still catches a line that loses
the process or the pid (issue 32: mutation run, fault wt-refusal-line)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from qpnserve.lifecycle.up import _first_refusal
from qpnserve.route_report import RouteRefusal, write_refusal


def test_refusal_line_names_the_first_refusing_process_its_pid_and_reason(
    tmp_path: Path,
) -> None:
    later = RouteRefusal(
        route_flag="1",
        process="VllmWorker-1",
        pid=5002,
        reason="second",
        written_at=datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC),
    )
    first = RouteRefusal(
        route_flag="1",
        process="MainProcess",
        pid=4242,
        reason="the host has no AWQ M1 route",
        written_at=datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC),
    )
    write_refusal(tmp_path, later)
    write_refusal(tmp_path, first)
    assert _first_refusal(tmp_path) == "MainProcess (pid 4242): the host has no AWQ M1 route"


def test_no_refusal_file_gives_no_refusal_line(tmp_path: Path) -> None:
    assert _first_refusal(tmp_path) is None
