"""The report directory's file format: the plugin writes through it, the lifecycle reads and
clears through it."""

from __future__ import annotations

import json
from pathlib import Path

from qpnserve.lifecycle.route_check import graph_summary
from qpnserve.route_report import (
    CapturedGraph,
    LayerDecision,
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


# A rank report exactly as the plugin wrote it before graph captures were recorded (schema 1).
SCHEMA_1_REPORT = """{
  "schema_version": 1,
  "route_flag": "1",
  "host_kind": "patched",
  "host_version": "1.3.0",
  "patch_id": "awq_m1_dispatch",
  "build_key": "k",
  "tp_rank": 2,
  "tp_size": 4,
  "pid": 4242,
  "written_at": "2026-12-01T18:00:00Z",
  "layers": [
    {
      "layer": "model.language_model.layers.0.mlp.experts",
      "admitted": true,
      "reason": ""
    },
    {
      "layer": "model.language_model.layers.1.mlp.experts",
      "admitted": true,
      "reason": ""
    }
  ]
}
"""


def test_a_schema_1_report_still_loads_and_reads_as_captures_not_recorded(tmp_path: Path) -> None:
    (tmp_path / "route-rank2.json").write_text(SCHEMA_1_REPORT)
    (loaded,) = read_reports(tmp_path)
    assert (loaded.schema_version, loaded.tp_rank, loaded.num_admitted) == (1, 2, 2)
    assert loaded.graphs_watched is False and loaded.planned_capture_sizes is None
    assert [d.captured for d in loaded.layers] == [[], []]
    summary = graph_summary([loaded], tp=4)
    assert summary.text.startswith("unknown: rank 2's report does not record graph captures")
    assert summary.fires_on_single_token is None


def test_a_report_with_captures_reads_back_as_written(tmp_path: Path) -> None:
    written = report(0).model_copy(
        update={
            "graphs_watched": True,
            "planned_capture_sizes": [1, 2],
            "layers": [
                LayerDecision(
                    layer="L0",
                    admitted=True,
                    captured=[
                        CapturedGraph(rows=1, route=True),
                        CapturedGraph(rows=2, route=False),
                    ],
                )
            ],
        }
    )
    write_report(tmp_path, written)
    raw = json.loads((tmp_path / "route-rank0.json").read_text())
    assert raw["schema_version"] == 2
    assert raw["layers"][0]["captured"] == [{"rows": 1, "route": True}, {"rows": 2, "route": False}]
    assert read_reports(tmp_path) == [written]
