"""`status`'s route values and their sources, read from a provenance record in a server
process's start environment. The records below are literal strings shaped exactly as ReVolta
0.1.4's profile writes them (``json.dumps(..., sort_keys=True)`` of ``{"version": 1, "values":
{NAME: {"source", "value"}}}``): tests/real_host/test_revolta_profile.py executes the real
module's writer and checks that shape."""

from __future__ import annotations

import subprocess
import sys

from qpnserve.route_sources import (
    ROUTE_VALUE_NAMES,
    ProcessEnviron,
    parse_provenance,
    read_environ,
    route_values,
    sources_line,
)

PROVENANCE = "VLLM_REVOLTA_PROFILE_PROVENANCE"
# The profile applied (V100, TP 4, FP16, AWQ) under `qpnserve up --awq-m1`: qpnserve's explicit
# flag, the operator's own MAX_TOKENS, the rest written by the profile; one upstream default.
RECORD_APPLIED = (
    '{"values": {'
    '"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": {"source": "profile", "value": "1"}, '
    '"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS": {"source": "environment", "value": "20"}, '
    '"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_PACK_ROWS": {"source": "profile", "value": "24"}, '
    '"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT": {"source": "profile", "value": "8"}, '
    '"VLLM_SM70_AWQ_QWEN38_QPN_M1": {"source": "environment", "value": "1"}, '
    '"VLLM_SM70_AWQ_TUNE_SMALL_SHAPES": {"source": "profile", "value": "1"}, '
    '"VLLM_SM70_QSA_INDEXER_CUBLAS": {"source": "upstream_default", "value": "1"}, '
    '"VLLM_V2_CUDAGRAPH_MEM_MIB": {"source": "profile", "value": "700"}'
    '}, "version": 1}'
)
EXPECTED_APPLIED = {
    "VLLM_SM70_AWQ_QWEN38_QPN_M1": ("1", "environment"),
    "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": ("1", "profile"),
    "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS": ("20", "environment"),
    "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT": ("8", "profile"),
    "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_PACK_ROWS": ("24", "profile"),
    "VLLM_SM70_AWQ_QWEN38_MOE_COMPACT_GROUPED_DECODE": (None, "default"),
    "VLLM_SM70_AWQ_MOE_COMPACT_METADATA": (None, "default"),
    "VLLM_SM70_AWQ_MOE_INT4_ZERO": (None, "default"),
    "VLLM_SM70_AWQ_TUNE_SMALL_SHAPES": ("1", "profile"),
    "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_ALLOWLIST": (None, "default"),
    # Not in the profile's inventory: the start environment decides.
    "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": ("7", "environment"),
}


def _sources(report: object) -> dict[str, tuple[str | None, str]]:
    return {v.name: (v.value, v.source) for v in report.values}  # type: ignore[attr-defined]


def test_status_takes_each_route_value_and_source_from_a_workers_record() -> None:
    leader = ProcessEnviron(100, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "1"})
    worker = ProcessEnviron(
        130,
        {
            "VLLM_SM70_AWQ_QWEN38_QPN_M1": "1",
            "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": "7",
            PROVENANCE: RECORD_APPLIED,
        },
    )
    report = route_values([leader, worker], "native")
    assert report.known and report.reason is None
    assert report.basis is not None and "pid 130" in report.basis
    assert _sources(report) == EXPECTED_APPLIED
    assert [v.name for v in report.values] == list(EXPECTED_APPLIED)


def test_status_sources_line_groups_the_values_by_source() -> None:
    worker = ProcessEnviron(
        130, {PROVENANCE: RECORD_APPLIED, "VLLM_SM70_AWQ_MOE_BATCHED_LAYER_DENYLIST": "7"}
    )
    assert sources_line(route_values([worker], "native")) == (
        "environment QWEN38_QPN_M1=1 QWEN38_GROUPED_QPN_MAX_TOKENS=20 "
        "MOE_BATCHED_LAYER_DENYLIST=7; "
        "profile QWEN38_GROUPED_QPN=1 QWEN38_GROUPED_QPN_SPLIT=8 QWEN38_GROUPED_QPN_PACK_ROWS=24 "
        "TUNE_SMALL_SHAPES=1; the other 4 at the host's default (VLLM_SM70_AWQ_*)"
    )
    nothing_set = route_values([ProcessEnviron(1, {})], "patched")
    assert sources_line(nothing_set) == "all 11 at the host's default (VLLM_SM70_AWQ_*)"


def test_upstream_default_in_a_record_is_reported_as_default_with_its_value() -> None:
    record = (
        '{"values": {"VLLM_SM70_AWQ_MOE_COMPACT_METADATA": '
        '{"source": "upstream_default", "value": "1"}}, "version": 1}'
    )
    assert parse_provenance(record) == {"VLLM_SM70_AWQ_MOE_COMPACT_METADATA": ("1", "default")}


def test_malformed_records_make_the_sources_unknown_naming_the_fault() -> None:
    cases = {
        "{not json": "not JSON",
        '{"values": {}, "version": 2}': "not a version 1 record",
        '{"version": 1}': "no 'values' object",
        '{"values": {"X": {"source": "cli", "value": "1"}}, "version": 1}': "row 'X'",
        '{"values": {"X": {"source": "profile", "value": 1}}, "version": 1}': "row 'X'",
    }
    for record, fault in cases.items():
        report = route_values([ProcessEnviron(7, {PROVENANCE: record})], "native")
        assert not report.known
        assert report.reason is not None and report.reason.startswith(f"pid 7's {PROVENANCE}")
        assert fault in report.reason, record
        assert {v.source for v in report.values} == {"unknown"}
        assert [v.name for v in report.values] == list(ROUTE_VALUE_NAMES)


def test_sources_are_unknown_with_the_reason_when_nothing_can_be_read() -> None:
    gone = route_values([], "native")
    assert not gone.known and gone.reason == "no process of the server is running to read"
    denied = route_values([ProcessEnviron(9, None, "permission denied")], "native")
    assert not denied.known and denied.reason is not None
    assert "pid 9: permission denied" in denied.reason
    assert sources_line(denied).startswith("unknown (cannot read the server's environment")


def test_a_native_server_without_a_record_is_unknown_never_default() -> None:
    report = route_values([ProcessEnviron(5, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "1"})], "native")
    assert not report.known and report.reason is not None and PROVENANCE in report.reason
    assert {v.source for v in report.values} == {"unknown"}


def test_a_patched_host_has_no_profile_so_the_start_environment_decides() -> None:
    report = route_values([ProcessEnviron(5, {"VLLM_SM70_AWQ_QWEN38_QPN_M1": "0"})], "patched")
    assert report.known and report.basis is not None and "pid 5" in report.basis
    got = _sources(report)
    assert got["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == ("0", "environment")
    assert got["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == (None, "default")


def test_read_environ_reads_a_live_process_and_names_a_gone_one() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={PROVENANCE: RECORD_APPLIED, "PATH": "/usr/bin:/bin"},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # past exec
        seen = read_environ(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
        child.stdout.close()
    assert seen.environ is not None and seen.environ[PROVENANCE] == RECORD_APPLIED
    assert _sources(route_values([seen], "native"))["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == (
        "1",
        "profile",
    )
    assert read_environ(child.pid).error == "gone"
