"""API-key servers: `up` hands the key to the server as VLLM_API_KEY (never in its argv), waits on
it with the key, a 401 is a key problem (never "raise --timeout-s"), and the planted key appears
in no file of the state folder and in no line qpnserve prints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from qpnserve.bench.client import probe_server
from qpnserve.errors import ServerError, UsageError
from qpnserve.lifecycle.options import UpOptions
from qpnserve.lifecycle.readiness import wait_ready
from tests.lifecycle.conftest import Env, cli, environ_of
from tests.support.json_http import JsonHandler, serving

PLANTED_KEY = "sk-planted-4b1d9e7c"  # a value no other text here contains


def files_holding(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


# --- the args: the key is taken out, one key only ---


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        (["--api-key", PLANTED_KEY], []),
        ([f"--api-key={PLANTED_KEY}", "--max-num-seqs", "4"], ["--max-num-seqs", "4"]),
        (
            ["--enforce-eager", "--api_key", PLANTED_KEY, "--dtype", "half"],
            ["--enforce-eager", "--dtype", "half"],
        ),
    ],
)
def test_api_key_after_dashdash_is_taken_out_of_the_server_args(
    extra: list[str], kept: list[str], tmp_path: Path
) -> None:
    opts = UpOptions(model=tmp_path, extra_args=extra)
    assert opts.extra_args == kept
    assert opts.api_key == PLANTED_KEY
    assert PLANTED_KEY not in repr(opts)


@pytest.mark.parametrize(
    "extra",
    [
        ["--api-key"],
        ["--api-key", "--dtype", "half"],
        ["--api-key", "k1", "k2"],
        ["--api-key", "k1", "--api-key", "k2"],
        ["--api-key="],
    ],
)
def test_api_key_without_exactly_one_value_is_refused(extra: list[str], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--api-key after `--`"):
        UpOptions(model=tmp_path, extra_args=extra)


# --- readiness and bench against a key-guarded stand-in ---


class _Guarded(JsonHandler):
    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {PLANTED_KEY}"

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {})
        elif not self._authorized():
            self._send(401, {"error": "Unauthorized"})
        else:
            self._send(200, {"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._authorized():
            self._send(401, {"error": "Unauthorized"})
        else:
            self._send(200, {"choices": [{"text": " hi", "index": 0}]})


@pytest.fixture
def guarded_url() -> Iterator[str]:
    with serving(_Guarded) as url:
        yield url


def _wait(url: str, key: str | None, tmp_path: Path) -> None:
    wait_ready(
        base_url=url,
        served_model_name="m",
        exit_code=lambda: None,
        log_path=tmp_path / "server.log",
        timeout_s=120,
        api_key=key,
    )


def test_readiness_with_the_key_passes(guarded_url: str, tmp_path: Path) -> None:
    _wait(guarded_url, PLANTED_KEY, tmp_path)


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (None, "wants an API key (HTTP 401) and VLLM_API_KEY is not set"),
        ("sk-wrong", "refused the API key in VLLM_API_KEY (HTTP 401)"),
    ],
)
def test_readiness_names_a_401_as_a_key_problem_not_a_slow_load(
    guarded_url: str, tmp_path: Path, key: str | None, said: str
) -> None:
    with pytest.raises(ServerError) as caught:
        _wait(guarded_url, key, tmp_path)
    assert said in caught.value.message
    assert "not ready after" not in caught.value.message
    assert "VLLM_API_KEY" in (caught.value.hint or "")
    assert "sk-wrong" not in caught.value.message


def test_bench_probe_names_a_401_as_a_key_problem(guarded_url: str) -> None:
    async def probe() -> None:
        async with httpx.AsyncClient() as client:
            await probe_server(client, guarded_url, None)

    with pytest.raises(ServerError, match="wants an API key"):
        asyncio.run(probe())


# --- `up` with a planted key, through the CLI, against the stand-in server ---


def test_up_passes_the_key_as_environment_and_stores_it_nowhere(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    result = cli("up", "--no-awq-m1", "--detach", "--json", "--", "--api-key", PLANTED_KEY)
    assert result.exit_code == 0, result.stderr
    running = json.loads(result.stdout)
    assert "note: --api-key goes to the server as VLLM_API_KEY" in result.stderr
    assert environ_of(running["pid"])["VLLM_API_KEY"] == PLANTED_KEY
    cmdline = Path(f"/proc/{running['pid']}/cmdline").read_bytes()
    assert PLANTED_KEY.encode() not in cmdline
    assert "--api-key" not in running["argv"]
    assert running["api_key_set"] is True
    base = f"http://127.0.0.1:{env.port}"
    assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401  # the key is in force
    # status talks to it with the key the operator exports, and names a missing one
    status = json.loads(cli("status", "--json").stdout)
    assert "/v1/models wants an API key" in status["health_detail"]
    monkeypatch.setenv("VLLM_API_KEY", PLANTED_KEY)
    status = json.loads(cli("status", "--json").stdout)
    assert status["health_detail"] == "/health: HTTP 200; /v1/models: HTTP 200"
    assert cli("down").exit_code == 0
    assert files_holding(env.state, PLANTED_KEY) == []
    assert PLANTED_KEY not in result.stdout + result.stderr


def test_up_key_argument_wins_over_the_exported_variable_as_in_vllm(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-exported-elsewhere")
    result = cli("up", "--no-awq-m1", "--detach", "--json", "--", f"--api-key={PLANTED_KEY}")
    assert result.exit_code == 0, result.stderr
    assert environ_of(json.loads(result.stdout)["pid"])["VLLM_API_KEY"] == PLANTED_KEY
    assert cli("down").exit_code == 0


def test_up_refuses_an_api_key_without_value_and_starts_nothing(env: Env) -> None:
    result = cli("up", "--no-awq-m1", "--detach", "--", "--api-key")
    assert result.exit_code == 2
    assert "error: --api-key after `--` needs a value" in result.stderr
    assert not env.server_json.exists()


def test_rollback_restart_refuses_to_drop_the_key_it_does_not_store(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert cli("up", "--awq-m1", "--detach", "--", "--api-key", PLANTED_KEY).exit_code == 0
    pid = json.loads(cli("status", "--json").stdout)["running"]["pid"]
    result = cli("rollback", "--restart")
    assert result.exit_code == 2
    assert "cannot restart: the server was started with an API key" in result.stderr
    assert json.loads(cli("status", "--json").stdout)["running"]["pid"] == pid  # still serving
    monkeypatch.setenv("VLLM_API_KEY", PLANTED_KEY)
    restarted = cli("rollback", "--restart")
    assert restarted.exit_code == 0, restarted.stderr
    new_pid = json.loads(cli("status", "--json").stdout)["running"]["pid"]
    assert new_pid != pid and environ_of(new_pid)["VLLM_API_KEY"] == PLANTED_KEY
    assert cli("down").exit_code == 0
    assert files_holding(env.state, PLANTED_KEY) == []
