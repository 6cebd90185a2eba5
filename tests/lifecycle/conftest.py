"""Fixtures of the lifecycle tests: a synthetic checkpoint, a private state dir, a free port,
the stand-in server (tests/support/fake_host.py, NOT vLLM) as the server module, and a teardown
that stops a server the test left recorded and FAILS the test if any process is left after that."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from qpnserve import config
from qpnserve.cli import app
from qpnserve.fixtures.checkpoint import write_checkpoint
from qpnserve.lifecycle import stages
from qpnserve.lifecycle.guards import PREFIX_VAR
from qpnserve.lifecycle.procs import read_stat
from tests.lifecycle.stages import test_stages

REPO_ROOT = Path(__file__).resolve().parents[2]
FACTS_V100_OK = REPO_ROOT / "tests" / "data" / "facts_v100_ok.json"
NUM_LAYERS = 4  # MoE layers of the synthetic checkpoint: small, the checks are the same
FAKE_HOST_MODULE = "tests.support.fake_host"
FAKE_HOST_VARS = (
    "FAKE_HOST_LOAD_S",
    "FAKE_HOST_NEVER_READY",
    "FAKE_HOST_CRASH_AFTER_S",
    "FAKE_HOST_CRASH_CODE",
    "FAKE_HOST_REJECT",
    "FAKE_HOST_IGNORE_SIGTERM",
    "FAKE_HOST_LAYERS",
    "FAKE_HOST_WORKERS",
    "FAKE_HOST_BUILD_KEY",
    "FAKE_HOST_STRAY",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Env:
    state: Path
    port: int
    model: Path

    @property
    def run_dir(self) -> Path:
        return self.state / "run"  # the server's cwd (launch plan)

    @property
    def server_json(self) -> Path:
        return self.state / "server.json"


def server_processes(run_dir: Path) -> dict[int, int]:
    """{pid: pgid} of live processes whose cwd is the server dir: the stand-in and its workers."""
    found = {}
    target = str(run_dir)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        stat = read_stat(int(entry.name))
        if cwd == target and stat is not None and stat.state not in ("Z", "X"):
            found[stat.pid] = stat.pgid
    return found


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen38-test", "ok", NUM_LAYERS)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: Path) -> Iterator[Env]:
    state = tmp_path / "state"
    port = free_port()
    monkeypatch.setenv(config.STATE_DIR.name, str(state))
    monkeypatch.setenv(config.FACTS_FILE.name, str(FACTS_V100_OK))
    monkeypatch.setenv(config.SERVER_MODULE.name, FAKE_HOST_MODULE)
    monkeypatch.setenv(config.MODEL.name, str(checkpoint))
    monkeypatch.setenv(config.PORT.name, str(port))
    monkeypatch.setenv(config.HOST.name, "127.0.0.1")
    monkeypatch.setenv(config.UP_TIMEOUT.name, "20")
    monkeypatch.setenv(config.STOP_TIMEOUT.name, "5")
    # The guards count processes titled "<prefix>::..." as leftovers of vLLM: a prefix of this
    # test's own keeps real vLLM servers of other jobs on the machine out of these tests.
    monkeypatch.setenv(PREFIX_VAR, f"QPNTEST{os.getpid()}x{port}")
    # The stand-in runs with cwd = the state dir: it finds the tests package through PYTHONPATH.
    pythonpath = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), pythonpath])))
    for name in (config.ROUTE_FLAG.name, config.VLLM_PLUGINS.name, config.REPORT_DIR.name):
        monkeypatch.delenv(name, raising=False)
    for name in (config.TP.name, config.BUILD_DIR.name, *FAKE_HOST_VARS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(stages, "default_stages", test_stages)
    made = Env(state=state, port=port, model=checkpoint)
    yield made
    fail_on_leftovers(made)


def fail_on_leftovers(env: Env) -> None:
    """Teardown: a server the test left recorded is stopped the way a user would (`qpnserve
    down`); any stand-in process still running after that was leaked (by the test, or by a
    `down` or a failed `up` that did not stop it): it is killed, and the test FAILS."""
    if env.server_json.exists():
        cli("down", "--timeout-s", "5")
    leftovers = server_processes(env.run_dir)
    if not leftovers:
        return
    described = [f"{pid} ({_cmdline(pid)})" for pid in sorted(leftovers)]
    for pgid in set(leftovers.values()) - {os.getpgrp()}:  # never pytest's own group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in leftovers:  # one that left its group
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pytest.fail(
        f"{len(leftovers)} process(es) of the stand-in server outlived the test and "
        f"`qpnserve down`: {', '.join(described)}",
        pytrace=False,
    )


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:80]


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}
