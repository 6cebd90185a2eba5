"""`status` carries each route value of the running server with its source, read from its
processes' start environments (/proc/PID/environ) against the stand-in server; and `up
--dry-run` shows what a host's own launch profile will apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpnserve import config
from qpnserve.host import HostInfo
from qpnserve.preflight.gather import load_facts_file
from tests.lifecycle.conftest import FACTS_V100_OK, Env, cli

PROVENANCE = "VLLM_REVOLTA_PROFILE_PROVENANCE"
# Shaped as ReVolta 0.1.4 writes it (tests/real_host/test_revolta_profile.py): the profile wrote
# the grouped route, qpnserve's explicit flag is "environment".
RECORD = (
    '{"values": {'
    '"VLLM_SM70_AWQ_QWEN38_GROUPED_QPN": {"source": "profile", "value": "1"}, '
    '"VLLM_SM70_AWQ_QWEN38_QPN_M1": {"source": "environment", "value": "1"}'
    '}, "version": 1}'
)


def _status_json() -> dict[str, object]:
    result = cli("status", "--json")
    assert result.exit_code == 0, result.stderr
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def _values(report: dict[str, object]) -> dict[str, tuple[object, object]]:
    section = report["route_values"]
    assert isinstance(section, dict)
    return {v["name"]: (v["value"], v["source"]) for v in section["values"]}


def test_status_reads_the_route_sources_from_the_servers_record(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROVENANCE, RECORD)
    assert cli("up", "--detach").exit_code == 0
    try:
        report = _status_json()
        text = cli("status").stdout
    finally:
        assert cli("down").exit_code == 0
    section = report["route_values"]
    assert isinstance(section, dict) and section["known"] is True
    assert PROVENANCE in section["basis"]
    values = _values(report)
    assert values["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == ("1", "environment")
    assert values["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"] == ("1", "profile")
    assert values["VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT"] == (None, "default")
    sources = [line for line in text.splitlines() if line.startswith("sources:  ")]
    assert len(sources) == 1
    assert sources[0] == (
        "sources:  environment QWEN38_QPN_M1=1; profile QWEN38_GROUPED_QPN=1; "
        "the other 9 at the host's default (VLLM_SM70_AWQ_*)"
    )


def test_status_on_a_host_without_a_profile_reads_the_start_environment(env: Env) -> None:
    assert cli("up", "--detach", "--no-awq-m1").exit_code == 0
    try:
        report = _status_json()
    finally:
        assert cli("down").exit_code == 0
    section = report["route_values"]
    assert isinstance(section, dict) and section["known"] is True
    assert "patched host has no launch profile" in section["basis"]
    assert _values(report)["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == ("0", "environment")


def test_status_without_a_running_server_has_no_route_values(env: Env) -> None:
    assert _status_json()["route_values"] is None


@pytest.fixture
def profile_host(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A native host whose ``vllm`` directory holds a profile file (literal tables, not ReVolta's
    code), named by a facts file, and a checkpoint with sparse-attention selector metadata."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "revolta_profile.py").write_text(
        "COMMON_DEFAULTS = {'VLLM_COMMON_A': '1'}\n"
        "AWQ_DEFAULTS = {'VLLM_SM70_AWQ_QWEN38_QPN_M1': '1',\n"
        "                'VLLM_SM70_AWQ_QWEN38_GROUPED_QPN': '1'}\n"
    )
    facts = load_facts_file(FACTS_V100_OK)
    facts.host = HostInfo(
        found=True, dist_name="revolta", version="0.1.4", kind="native", package_dir=str(package)
    )
    path = tmp_path / "facts_native.json"
    path.write_text(facts.model_dump_json())
    monkeypatch.setenv(config.FACTS_FILE.name, str(path))
    cfg_path = env.model / "config.json"
    cfg = json.loads(cfg_path.read_text())
    model = tmp_path / "qsa-model"
    model.mkdir()
    for item in env.model.iterdir():
        (model / item.name).symlink_to(item)
    (model / "config.json").unlink()
    text = cfg.setdefault("text_config", {})
    text.update(
        indexer_n_heads=16, indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=2048,
        indexer_compress_ratio=4, layer_types=["qwen_sparse_attention"],
    )  # fmt: skip
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def test_dry_run_shows_what_the_hosts_profile_will_apply(profile_host: Path) -> None:
    result = cli("up", "--dry-run", "--model", str(profile_host), "--no-awq-m1")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# host launch profile "))
    assert lines[start].endswith("revolta_profile.py: applies if: every visible GPU is SM70")
    assert lines[start + 1 : start + 5] == [
        "#   qpnserve's launch defaults left to the profile: none (every one stays, "
        "docs/operator.md)",
        "#   VLLM_COMMON_A=1 (profile)",
        "#   VLLM_SM70_AWQ_QWEN38_QPN_M1=0 (environment, wins over the profile's 1)",
        "#   VLLM_SM70_AWQ_QWEN38_GROUPED_QPN=1 (profile)",
    ]
    as_json = cli(
        "up", "--dry-run", "--json", "--no-awq-m1", "--model", str(profile_host), "--tp", "2"
    )
    assert as_json.exit_code == 0, as_json.stderr
    shown = json.loads(as_json.stdout)["host_profile"]
    assert shown["applies"] is False and shown["values"] == []
    assert "tensor parallel 4: --tensor-parallel-size 2" in shown["summary"]
