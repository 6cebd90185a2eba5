"""What `status` and `up --dry-run` say about the route on a native host (the flag's default is
on there) and about the host's grouped decode route on the same layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpnserve import config
from qpnserve.cli.server import render_status
from qpnserve.host import HostInfo
from qpnserve.host_routes import grouped_route_text, route_flag_meaning
from qpnserve.lifecycle import StatusReport
from qpnserve.preflight.gather import load_facts_file
from tests.lifecycle.conftest import FACTS_V100_OK, Env, cli
from tests.lifecycle.test_route_check import running

GROUPED = "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"


def test_unset_flag_means_on_only_on_a_native_host() -> None:
    assert route_flag_meaning(None, "native").startswith("on (")
    assert route_flag_meaning(None, "patched").startswith("off (")
    assert route_flag_meaning("0", "native").startswith("off (")


def test_grouped_route_is_shown_on_native_hosts_only() -> None:
    env = {GROUPED: "1", "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS": "40"}
    native = grouped_route_text(env, "native")
    assert native is not None and "is on (most rows 40)" in native
    assert grouped_route_text(env, "patched") is None
    unset = grouped_route_text({}, "native")
    assert unset is not None and "profile" in unset


def test_status_on_native_host_names_explicit_flag_and_grouped_route() -> None:
    server = running("1", host_kind="native", env={config.ROUTE_FLAG.name: "1", GROUPED: "1"})
    text = render_status(
        StatusReport(
            state_dir="/s", desired=None, running=server, server="ready", restart_needed=False
        )
    )
    assert "route on (VLLM_SM70_AWQ_QWEN38_QPN_M1=1; explicit, the host fails closed" in text
    assert f"{GROUPED}=1: the host's grouped decode route" in text


@pytest.fixture
def native_facts(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    facts = load_facts_file(FACTS_V100_OK)
    facts.host = HostInfo(found=True, dist_name="revolta", version="0.1.4", kind="native")
    path = tmp_path / "facts_native.json"
    path.write_text(facts.model_dump_json())
    monkeypatch.setenv(config.FACTS_FILE.name, str(path))
    return path


def test_dry_run_on_native_host_says_route_and_grouped_route(native_facts: Path) -> None:
    result = cli("up", "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "# host revolta 0.1.4 (native): route on (VLLM_SM70_AWQ_QWEN38_QPN_M1=1;" in (
        result.stdout
    )
    assert f"# {GROUPED} unset" in lines
    off = cli("up", "--dry-run", "--no-awq-m1", "--json")
    assert off.exit_code == 0, off.stderr
    plan = json.loads(off.stdout)
    assert plan["route"] == "off (VLLM_SM70_AWQ_QWEN38_QPN_M1=0)"
    assert plan["host"] == "revolta 0.1.4 (native)"
