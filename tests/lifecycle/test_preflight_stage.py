"""`up`'s preflight stage judges the environment it is given (the server's), not this
process's, and never changes this process's environment."""

from __future__ import annotations

import os

import pytest

from qpnserve import config
from qpnserve.config import load_settings
from qpnserve.errors import PreflightError
from qpnserve.lifecycle.options import UpOptions
from qpnserve.lifecycle.stages import run_preflight_stage
from tests.lifecycle.conftest import Env


def test_preflight_stage_judges_the_server_env_not_the_callers(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.ROUTE_FLAG.name, "2")  # would FAIL `check` in this process
    before = dict(os.environ)
    server_env = {**os.environ, config.ROUTE_FLAG.name: "1"}
    host = run_preflight_stage(
        UpOptions(model=env.model), server_env, lambda _: None, load_settings()
    )
    assert host.kind == "patched"
    assert dict(os.environ) == before


def test_preflight_stage_fails_on_a_variable_only_the_server_env_holds(env: Env) -> None:
    server_env = {**os.environ, config.ROUTE_FLAG.name: "1", "VLLM_SM70_AWQ_MOE_DISABLE": "1"}
    with pytest.raises(PreflightError) as info:
        run_preflight_stage(UpOptions(model=env.model), server_env, lambda _: None, load_settings())
    assert "toolchain.host_env: VLLM_SM70_AWQ_MOE_DISABLE=1" in info.value.message
    assert "VLLM_SM70_AWQ_MOE_DISABLE" not in os.environ
