"""Guards before a start: leftover vLLM processes (by their title prefix) and processes holding
memory on the server's GPUs are named by pid and command; `up` refuses over them (exit 4) with the
command that clears them; GPU use NVML cannot report is "unknown", never "none"; host RAM below
the checkpoint's size is a WARN. Judged on planted facts, and on planted processes whose title
the test sets (setproctitle, as vLLM does, and `exec -a`), with NVML faked where it is needed."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpnserve.lifecycle.guards import (
    GpuUse,
    GuardFacts,
    ProcEntry,
    check_rows,
    gpus_for_server,
    judge,
    ram_warning,
)
from qpnserve.lifecycle.guards_probe import gather_guard_facts, vllm_processes
from tests.lifecycle.conftest import Env, cli

GIB = 2**30


def facts(**fields: object) -> GuardFacts:
    base: dict[str, object] = {
        "prefix": "VLLM",
        "vllm_processes": [],
        "commands": {},
        "gpus_used": [0, 1],
        "gpu_use": [GpuUse(0, 400), GpuUse(1, 400), GpuUse(2, 400), GpuUse(3, 400)],
    }
    base.update(fields)
    return GuardFacts(**base)  # type: ignore[arg-type]


WORKER = ProcEntry(pid=321, title="VLLM::Worker_TP1", command="VLLM::Worker_TP1")


# --- pure judging ---


def test_a_process_holding_memory_on_a_server_gpu_blocks_by_pid_and_command() -> None:
    uses = [GpuUse(0, 9000, {4242: 8192}), GpuUse(1, 400), GpuUse(3, 9000, {777: 8192})]
    verdict = judge(facts(gpu_use=uses, commands={4242: "python train.py"}))
    assert [b.text() for b in verdict.blockers] == [
        "pid 4242 (python train.py): holds 8192 MiB on GPU 0"
    ]  # pid 777 is on GPU 3, which a TP-2 server on GPUs 0,1 does not use
    assert verdict.gpu_state == "held"
    assert verdict.clear_command.startswith("kill 4242 ")


def test_a_vllm_process_that_holds_nothing_on_these_gpus_is_named_but_does_not_block() -> None:
    verdict = judge(facts(vllm_processes=[WORKER]))
    assert verdict.blockers == []
    assert verdict.gpu_state == "no other process"
    assert verdict.bystanders == [WORKER]


def test_without_nvml_every_leftover_vllm_process_blocks_and_gpu_use_is_unknown() -> None:
    verdict = judge(facts(vllm_processes=[WORKER], gpu_use=None, nvml_error="no driver"))
    assert [b.pid for b in verdict.blockers] == [321]
    assert verdict.gpu_state == "unknown (NVML cannot say: no driver)"
    rows = check_rows(verdict, "VLLM")
    assert rows[0].status == "FAIL"
    assert "pid 321 (VLLM::Worker_TP1): leftover vLLM process (GPU use unknown)" in rows[0].reason


def test_memory_in_use_with_no_process_named_is_unknown_not_none() -> None:
    """A container shows another namespace's memory but not its processes."""
    verdict = judge(facts(gpu_use=[GpuUse(0, 30000), GpuUse(1, 400)]))
    assert verdict.gpu_state.startswith("unknown (GPU 0 has 30000 MiB in use but NVML names")
    rows = check_rows(verdict, "VLLM")
    assert rows[0].status == "WARN" and "none" not in rows[0].reason.split(";")[0]


def test_nothing_on_the_gpus_and_no_leftover_passes() -> None:
    rows = check_rows(judge(facts()), "VLLM")
    assert [(r.name, r.status) for r in rows] == [("gpu.leftover_processes", "PASS")]


@pytest.mark.parametrize(
    ("visible", "tp", "expected"),
    [
        (None, 2, [0, 1]),
        ("2,3", 2, [2, 3]),
        ("3,1,0", 2, [3, 1]),
        ("GPU-bbbb", 1, [1]),
        ("7", 1, None),
        ("GPU-", 1, None),  # a prefix of both UUIDs: ambiguous
    ],
)
def test_gpus_for_server_follow_cuda_visible_devices(
    visible: str | None, tp: int, expected: list[int] | None
) -> None:
    uuids = {"GPU-aaaa-1": 0, "GPU-bbbb-2": 1}
    assert gpus_for_server(visible, [0, 1, 2, 3], uuids, tp) == expected


def test_host_ram_below_the_checkpoint_is_a_warning_with_its_reason() -> None:
    assert ram_warning(60 * GIB, 59 * GIB) is None
    text = ram_warning(16 * GIB, 60 * GIB)
    assert text == (
        "host RAM available 16.0 GiB is less than the checkpoint's 60.0 GiB: "
        "loading may swap or be OOM-killed"
    )
    rows = check_rows(judge(facts(mem_available_bytes=16 * GIB, checkpoint_bytes=60 * GIB)), "V")
    assert ("checkpoint.host_ram", "WARN") in [(r.name, r.status) for r in rows]


# --- planted processes ---


@pytest.fixture
def planted(env: Env) -> Iterator[subprocess.Popen[bytes]]:
    """A process titled `<prefix>::Worker_TP0` the way vLLM titles it (setproctitle)."""
    import os

    prefix = os.environ["VLLM_PROCESS_NAME_PREFIX"]
    code = (
        "import setproctitle, sys, time\n"
        f"setproctitle.setproctitle('{prefix}::Worker_TP0')\n"
        "print('titled', flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"titled\n"
    yield proc
    proc.kill()
    proc.wait()


def test_probe_finds_processes_by_their_title_prefix(planted: subprocess.Popen[bytes]) -> None:
    import os

    prefix = os.environ["VLLM_PROCESS_NAME_PREFIX"]
    other = subprocess.Popen(["bash", "-c", f'exec -a "{prefix}::EngineCore" sleep 300'])
    try:
        found = {p.pid: p.title for p in vllm_processes(prefix, exclude=set())}
        for _ in range(50):  # until bash has exec'd
            if other.pid in found:
                break
            found = {p.pid: p.title for p in vllm_processes(prefix, exclude=set())}
        assert found == {planted.pid: f"{prefix}::Worker_TP0", other.pid: f"{prefix}::EngineCore"}
    finally:
        other.kill()
        other.wait()


def test_up_refuses_over_a_leftover_vllm_process_naming_its_pid(
    env: Env, planted: subprocess.Popen[bytes]
) -> None:
    result = cli("up", "--no-awq-m1", "--detach")
    assert result.exit_code == 4, result.stderr
    assert "error: 1 process would share the server's GPUs: " in result.stderr
    assert f"pid {planted.pid} (" in result.stderr
    assert "leftover vLLM process (GPU use unknown)" in result.stderr
    assert f"hint: stop them, then retry: kill {planted.pid}" in result.stderr
    assert not env.server_json.exists()
    dry = cli("up", "--no-awq-m1", "--dry-run")
    assert dry.exit_code == 4 and f"pid {planted.pid} (" in dry.stderr


def test_check_names_a_leftover_vllm_process_by_pid(
    env: Env, planted: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QPNSERVE_FACTS_FILE")  # probe this machine: guards judge live facts
    result = cli("check", "--only", "gpu", "--json")
    rows = {r["name"]: r for r in json.loads(result.stdout)["results"]}
    row = rows["gpu.leftover_processes"]
    assert row["status"] == "FAIL"
    assert f"pid {planted.pid} (" in row["reason"]
    assert row["fix"].startswith(f"stop them: kill {planted.pid}")


def _fake_nvml(holders: dict[int, list[types.SimpleNamespace]]) -> object:
    """Four GPUs; each uses the driver's 400 MiB plus what its listed processes hold."""

    def used(handle: int) -> int:
        return 400 * 2**20 + sum(p.usedGpuMemory for p in holders.get(handle, []))

    return types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetUUID=lambda handle: f"GPU-{handle}",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=used(handle)),
        nvmlDeviceGetComputeRunningProcesses=lambda handle: holders.get(handle, []),
    )


def test_up_refuses_over_a_process_holding_memory_on_its_gpus(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in NVML (no driver here): GPU 0 is held by pid 4242, e.g. an orphaned worker."""
    proc = types.SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({0: [proc]}))
    result = cli("up", "--detach")
    assert result.exit_code == 4, result.stderr
    assert "pid 4242 (" in result.stderr and "holds 3072 MiB on GPU 0" in result.stderr
    assert not env.server_json.exists()


def test_a_holder_on_a_gpu_outside_cuda_visible_devices_does_not_block(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = types.SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({3: [proc]}))
    facts_seen = gather_guard_facts({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, Path(env.model))
    assert facts_seen.gpus_used == [0, 1]
    assert judge(facts_seen).blockers == []
    assert facts_seen.checkpoint_bytes is not None  # the synthetic checkpoint's shards
