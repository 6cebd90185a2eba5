"""`status --url` and `report --url` against a server qpnserve did not start (the stand-in,
launched here by hand as an operator launches `vllm serve`), with a planted API key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.lifecycle.conftest import REPO_ROOT, Env, cli

KEY = "sk-url-planted-key-6e2d1"


@pytest.fixture
def foreign(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[bytes]]:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    server_env = {**os.environ, "VLLM_API_KEY": KEY, "VLLM_SM70_AWQ_QWEN38_QPN_M1": "0"}
    server_env["PYTHONPATH"] = str(REPO_ROOT)
    argv = [sys.executable, "-m", "tests.support.fake_host", "--model", str(env.model)]
    argv += ["--port", str(env.port), "--tensor-parallel-size", "2"]
    proc = subprocess.Popen(argv, env=server_env, start_new_session=True)
    url = f"http://127.0.0.1:{env.port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    yield proc
    os.killpg(proc.pid, 9)
    proc.wait()


def test_status_url_says_what_it_sees_and_what_it_cannot_know(
    env: Env, foreign: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{env.port}/v1"
    seen = json.loads(cli("status", "--url", url, "--json").stdout)
    assert seen["url"] == f"http://127.0.0.1:{env.port}"
    assert seen["healthy"] is True
    assert "/v1/models wants an API key (HTTP 401)" in seen["health_detail"]
    assert seen["listener_pid"] == foreign.pid
    assert len(seen["processes"]) == 3  # the stand-in and its two "workers"
    assert seen["route_env"]["VLLM_SM70_AWQ_QWEN38_QPN_M1"] == "0"
    assert any("took the route" in what for what in seen["unknown"])
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    text = cli("status", "--url", url).stdout
    assert "not started by qpnserve" in text
    assert "/v1/models: HTTP 200" in text
    assert f"models:   {env.model.name}" in text
    assert f"(source: /proc/{foreign.pid}/environ)" in text


def test_status_url_of_a_remote_host_names_its_processes_as_unknown() -> None:
    seen = json.loads(cli("status", "--url", "http://192.0.2.1:9", "--json").stdout)
    assert seen["healthy"] is False and seen["processes"] == []
    assert seen["unknown"][0].startswith("its processes and environment")


def test_report_url_packs_its_status_without_the_key(
    env: Env, foreign: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    out = tmp_path / "u.tar.gz"
    done = cli("report", "--url", f"http://127.0.0.1:{env.port}", "--out", str(out), "--json")
    assert done.exit_code == 0, done.stderr
    assert "(not started by qpnserve)" in json.loads(done.stdout)["summary"]["server"]
    with tarfile.open(out) as tar:
        blobs = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert json.loads(blobs["url-status.json"])["listener_pid"] == foreign.pid
    assert not any(KEY.encode() in blob for blob in blobs.values())
