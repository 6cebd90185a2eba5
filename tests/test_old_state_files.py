"""State and route-report files as commit 9f67897 wrote them still load, value for value.

tests/data/state_9f67897/ holds, unchanged, a state directory that `qpnserve up --awq-m1` of
that commit leaves behind on a patched host once the server is ready: desired.json, server.json
and one rank's route report (written by hand from that commit's models; that commit's own
writers produce them byte for byte). An upgraded qpnserve must read them: `status`, `down` and
`rollback` of a server started before the upgrade depend on it. The expected values are literals;
never regenerate the files from the current models.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from qpnserve.route_report import read_reports
from qpnserve.state import read_desired, read_running

OLD_STATE = Path(__file__).resolve().parent / "data" / "state_9f67897"
STATE_DIR = "/home/op/.local/state/qpnserve"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the old state directory (a reader that rewrote a file would not touch the data)."""
    copy = tmp_path / "state"
    shutil.copytree(OLD_STATE, copy)
    return copy


def test_old_desired_state_loads_field_by_field(root: Path) -> None:
    desired = read_desired(root)
    assert desired is not None
    assert desired.schema_version == 1
    assert desired.awq_m1 is True
    assert desired.include_plugin is True
    assert desired.model == "/models/Qwen3.8-AWQ"
    assert desired.served_model_name is None
    assert desired.tp == 4
    assert desired.host == "127.0.0.1"
    assert desired.port == 8000
    assert desired.extra_args == ["--max-model-len", "16384"]
    assert desired.server_module is None
    assert desired.updated_at == datetime(2026, 11, 30, 8, 14, 3, 512345, tzinfo=UTC)


def test_old_running_state_loads_field_by_field(root: Path) -> None:
    running = read_running(root)
    assert running is not None
    assert running.schema_version == 1
    assert running.phase == "ready"
    assert (running.pid, running.pgid, running.proc_start_ticks) == (48213, 48213, 9087731)
    assert running.started_at == datetime(2026, 11, 30, 8, 14, 5, 104227, tzinfo=UTC)
    assert running.ready_at == datetime(2026, 11, 30, 8, 31, 47, 880016, tzinfo=UTC)
    assert running.argv[:5] == [
        "/opt/1cat/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/Qwen3.8-AWQ",
    ]
    assert running.argv[-3:] == ['{"image":0,"video":0}', "--max-model-len", "16384"]
    assert len(running.argv) == 29
    assert running.env == {
        "VLLM_SM70_AWQ_QWEN38_QPN_M1": "1",
        "VLLM_PLUGINS": "qpnserve_awq_m1",
        "QPNSERVE_REPORT_DIR": f"{STATE_DIR}/reports",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": None,
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS": None,
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT": None,
        "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_PACK_ROWS": None,
    }
    assert running.cwd == f"{STATE_DIR}/run"
    assert running.route_flag == "1"
    assert running.include_plugin is True
    assert running.host_kind == "patched"
    assert running.host_version == "1.3.0"
    assert running.patch_id == "awq_m1_dispatch"
    assert running.build_key == "645a1c85f8302701a619"
    assert running.model == "/models/Qwen3.8-AWQ"
    assert running.served_model_name == "Qwen3.8-AWQ"
    assert (running.tp, running.host, running.port) == (4, "127.0.0.1", 8000)
    assert running.extra_args == ["--max-model-len", "16384"]
    assert running.server_module == "vllm.entrypoints.openai.api_server"
    assert running.log_path == f"{STATE_DIR}/logs/server-20261130T081405Z-48190.log"
    assert running.report_dir == f"{STATE_DIR}/reports"
    assert running.base_url == "http://127.0.0.1:8000"


def test_old_route_report_loads_field_by_field(root: Path) -> None:
    reports = read_reports(root / "reports")
    assert len(reports) == 1
    report = reports[0]
    assert report.schema_version == 1
    assert report.route_flag == "1"
    assert report.host_kind == "patched"
    assert report.host_version == "1.3.0"
    assert report.patch_id == "awq_m1_dispatch"
    assert report.build_key == "645a1c85f8302701a619"
    assert (report.tp_rank, report.tp_size, report.pid) == (2, 4, 48377)
    assert report.written_at == datetime(2026, 11, 30, 8, 29, 12, 4518, tzinfo=UTC)
    assert [(d.layer, d.admitted, d.reason) for d in report.layers] == [
        ("model.language_model.layers.0.mlp.experts", True, ""),
        ("model.language_model.layers.47.mlp.experts", True, ""),
    ]
    assert report.num_admitted == 2


def test_loading_old_files_leaves_them_unchanged(root: Path) -> None:
    read_desired(root)
    read_running(root)
    read_reports(root / "reports")
    for path in sorted(OLD_STATE.rglob("*.json")):
        copy = root / path.relative_to(OLD_STATE)
        assert copy.read_bytes() == path.read_bytes(), copy
