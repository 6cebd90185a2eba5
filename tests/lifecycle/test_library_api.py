"""The stage functions `bench ab` calls (qpnserve.lifecycle.up/down/status), used directly."""

from __future__ import annotations

import pytest

from qpnserve import lifecycle
from qpnserve.config import load_settings
from qpnserve.lifecycle.procs import group_members
from tests.lifecycle.conftest import Env
from tests.lifecycle.stages import test_stages


def test_up_reports_progress_while_waiting_with_the_logs_last_line(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HOST_LOAD_S", "1.5")
    said: list[str] = []
    opts = lifecycle.UpOptions(
        model=env.model,
        port=env.port,
        detach=True,
        timeout_s=20,
        server_module="tests.support.fake_host",
        progress_every_s=0.2,
    )
    running = lifecycle.up(
        opts, progress=said.append, stages=test_stages(), settings=load_settings()
    )
    waiting = [line for line in said if line.startswith("waiting ") and "/20 s for" in line]
    loading = [line for line in waiting if "for /health (HTTP 503)" in line]
    assert loading, said
    assert "; log: [fake host (test stand-in, not vLLM)" in loading[-1]
    assert lifecycle.status(settings=load_settings()).server == "ready"
    result = lifecycle.down(timeout_s=5, progress=said.append, settings=load_settings())
    assert result.stopped and result.pid == running.pid
    assert group_members(running.pgid) == []
    assert lifecycle.status(settings=load_settings()).running is None


def test_down_with_nothing_recorded_is_a_no_op(env: Env) -> None:
    assert (
        lifecycle.down(timeout_s=1, progress=lambda _: None, settings=load_settings()).stopped
        is False
    )
