"""$QPNSERVE_VERIFY_CAPTURE_DIR is live verify's hand-off to the one server it starts. Exported
in the user's shell it must not reach a server `up` starts: there the plugin would wrap a native
host's hook and capture on every armed decode step of a production server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpnserve.config import VERIFY_CAPTURE_DIR
from tests.lifecycle.conftest import Env, cli, env, environ_of  # noqa: F401


def test_an_exported_capture_dir_does_not_reach_the_server(
    env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(VERIFY_CAPTURE_DIR.name, str(tmp_path / "capture"))
    result = cli("up", "--detach", "--no-awq-m1", "--json")
    assert result.exit_code == 0, result.stderr
    server_env = environ_of(json.loads(result.stdout)["pid"])
    assert VERIFY_CAPTURE_DIR.name not in server_env
    assert "VLLM_SM70_AWQ_QWEN38_QPN_M1" in server_env  # the environment qpnserve composed
    assert cli("down").exit_code == 0
