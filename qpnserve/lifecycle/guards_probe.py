"""The guards' facts, gathered once: vLLM-titled processes (/proc), who holds memory on which GPU
(NVML), host memory (/proc/meminfo), the checkpoint's size (file sizes only, nothing is read).
Every probe that cannot answer records that; none raises. The judging is in guards.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from qpnserve.lifecycle.guards import (
    DEFAULT_PREFIX,
    PREFIX_VAR,
    GpuUse,
    GuardFacts,
    ProcEntry,
    check_rows,
    gpus_for_server,
    is_vllm_title,
    judge,
)
from qpnserve.preflight.report import PreflightReport, make_report

_PROC = Path("/proc")
COMMAND_CHARS = 160
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def read_command(pid: int) -> tuple[str, str, str] | None:
    """(argv[0], the command line, comm) of ``pid``; None if it is gone or not readable.
    setproctitle pads the rewritten argv with NULs: they are dropped."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
        comm = (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not args:  # a kernel thread, or a zombie
        return None
    return args[0], " ".join(args)[:COMMAND_CHARS], comm


def vllm_processes(prefix: str, exclude: set[int]) -> list[ProcEntry]:
    found = []
    with contextlib.suppress(OSError):
        for entry in _PROC.iterdir():
            if not entry.name.isdigit() or int(entry.name) in exclude:
                continue
            seen = read_command(int(entry.name))
            if seen is None or not is_vllm_title(seen[0], seen[2], prefix):
                continue
            title = seen[0] if seen[0].startswith(f"{prefix}::") else seen[2]
            found.append(ProcEntry(pid=int(entry.name), title=title, command=seen[1]))
    return sorted(found, key=lambda p: p.pid)


def nvml_use() -> tuple[list[GpuUse] | None, list[int], dict[str, int], str | None]:
    """(per-GPU use, NVML indices, uuid -> index, error). Use is None when NVML cannot say."""
    try:
        import pynvml
    except ImportError as exc:
        return None, [], {}, f"nvidia-ml-py is not importable ({exc})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and OSError subclasses, by driver state
        return None, [], {}, f"NVML did not initialise: {exc}"
    try:
        uses, uuids = [], {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            with contextlib.suppress(Exception):
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuids[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = index
            used_mib = None
            with contextlib.suppress(Exception):
                used_mib = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20
            holders: dict[int, int | None] = {}
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(proc, "usedGpuMemory", None)
                holders[int(proc.pid)] = int(used) // 2**20 if isinstance(used, int) else None
            uses.append(GpuUse(index=index, used_mib=used_mib, holders=holders))
        return uses, [u.index for u in uses], uuids, None
    except Exception as exc:
        return None, [], {}, f"NVML query failed: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def mem_available_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in (_PROC / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def checkpoint_bytes(model: Path | None) -> int | None:
    """The weight files' sizes from the directory listing (stat only: weights are never read)."""
    if model is None or not model.is_dir():
        return None
    total = 0
    with contextlib.suppress(OSError):
        for path in model.iterdir():
            if path.name.endswith(WEIGHT_SUFFIXES) and path.is_file():
                total += path.stat().st_size
    return total or None


def gather_guard_facts(environ: Mapping[str, str], tp: int, model: Path | None) -> GuardFacts:
    """The facts for a server with environment ``environ`` (its title prefix and
    CUDA_VISIBLE_DEVICES) and tensor-parallel size ``tp``."""
    prefix = environ.get(PREFIX_VAR) or DEFAULT_PREFIX
    procs = vllm_processes(prefix, exclude={os.getpid()})
    uses, indices, uuids, error = nvml_use()
    used = gpus_for_server(environ.get("CUDA_VISIBLE_DEVICES"), indices, uuids, tp)
    commands = {p.pid: p.command for p in procs}
    for gpu in uses or []:
        for pid in gpu.holders:
            seen = read_command(pid) if pid not in commands else None
            if seen is not None:
                commands[pid] = seen[1]
    return GuardFacts(
        prefix=prefix,
        vllm_processes=procs,
        commands=commands,
        gpus_used=used if uses is not None else None,
        gpu_use=uses,
        nvml_error=error,
        mem_available_bytes=mem_available_bytes(),
        checkpoint_bytes=checkpoint_bytes(model),
    )


def with_guard_rows(
    report: PreflightReport, environ: Mapping[str, str], tp: int, model: Path | None
) -> PreflightReport:
    """`check`'s report plus the guards' rows, judged on this machine: only for probed facts
    (recorded facts describe another machine, whose processes cannot be seen from here)."""
    if report.facts.source == "recorded" or "gpu" not in report.groups:
        return report
    facts = gather_guard_facts(environ, tp, model)
    rows = check_rows(judge(facts), facts.prefix)
    if "checkpoint" not in report.groups:
        rows = [r for r in rows if r.group != "checkpoint"]
    return make_report(
        report.results + rows, report.facts, report.groups, report.tp, report.awq_m1, report.model
    )
