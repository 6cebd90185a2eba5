"""Readiness needs the one-token completion after /health and /v1/models: a server that answers
/health but cannot generate (a dead engine behind a live API process) is not ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qpnserve.errors import ServerError
from qpnserve.lifecycle.readiness import wait_ready
from tests.support.json_http import JsonHandler, serving

MODEL = "m"


def _handler(completion_status: int) -> type[JsonHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": MODEL}]})
            else:
                self._send(404, {})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if completion_status == 200:
                self._send(200, {"choices": [{"text": " hi", "index": 0}]})
            else:
                self._send(completion_status, {"error": "engine dead"})

    return Handler


@pytest.fixture
def standin(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server that passes /health and /v1/models; its completion answers request.param."""
    with serving(_handler(request.param)) as url:
        yield url


def _wait(base_url: str, log: Path) -> None:
    wait_ready(
        base_url=base_url,
        served_model_name=MODEL,
        exit_code=lambda: None,
        log_path=log,
        timeout_s=1.0,
        poll_s=0.05,
    )


@pytest.mark.parametrize("standin", [500], indirect=True)
def test_healthy_server_whose_completion_fails_is_not_ready(standin: str, tmp_path: Path) -> None:
    with pytest.raises(ServerError) as info:
        _wait(standin, tmp_path / "server.log")
    assert "waiting for a one-token completion" in info.value.message
    assert "completion HTTP 500" in info.value.message


@pytest.mark.parametrize("standin", [200], indirect=True)
def test_server_that_completes_one_token_is_ready(standin: str, tmp_path: Path) -> None:
    _wait(standin, tmp_path / "server.log")  # returns: no ServerError
