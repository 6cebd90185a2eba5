"""Guards before a start: leftover vLLM processes, processes holding memory on the GPUs the new
server will use, and host RAM against the checkpoint. Pure: facts in (guards_probe.py gathers
them once), verdict and check rows out.

Why: orphaned and wedged TP workers are the most common lifecycle complaint of vLLM users on
V100 (workers left after an OOM or a SIGKILL of the API server keep their GPU memory, an
EngineCore stuck until reboot); a new server on those GPUs then fails with an out-of-memory
error that names no cause. vLLM titles its processes `<prefix>::EngineCore`,
`<prefix>::Worker_TP0`, ... with the prefix from VLLM_PROCESS_NAME_PREFIX (default "VLLM").

Where NVML cannot say who holds memory on a GPU (no driver, a container that hides other pid
namespaces), GPU use is "unknown", never "none", and every leftover vLLM process counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qpnserve.preflight.report import CheckResult, result

DEFAULT_PREFIX = "VLLM"
PREFIX_VAR = "VLLM_PROCESS_NAME_PREFIX"
# A GPU with no compute process listed still shows the driver's own reservation (a few hundred
# MiB on V100 and H200); more than this with no process named means NVML hides the holders.
UNLISTED_USE_LIMIT_MIB = 1024


@dataclass(frozen=True)
class ProcEntry:
    pid: int
    title: str  # argv[0] as the process set it (setproctitle rewrites it), or comm
    command: str  # the whole command line, shortened


@dataclass(frozen=True)
class GpuUse:
    index: int  # NVML index
    used_mib: int | None
    holders: dict[int, int | None] = field(default_factory=dict)  # pid -> MiB (None: unknown)


@dataclass(frozen=True)
class GuardFacts:
    prefix: str
    vllm_processes: list[ProcEntry]  # titled "<prefix>::..."
    commands: dict[int, str]  # pid -> command, for the GPU holders visible from here
    gpus_used: list[int] | None  # NVML indices the server will use; None: cannot map them
    gpu_use: list[GpuUse] | None  # None: NVML could not say
    nvml_error: str | None = None
    mem_available_bytes: int | None = None
    checkpoint_bytes: int | None = None


@dataclass(frozen=True)
class Blocker:
    pid: int
    command: str
    why: str  # "holds 3072 MiB on GPU 0", "leftover vLLM process (GPU use unknown)"

    def text(self) -> str:
        return f"pid {self.pid} ({self.command}): {self.why}"


@dataclass(frozen=True)
class GuardVerdict:
    blockers: list[Blocker]
    gpu_state: str  # "no other process", "held", or "unknown (<why>)"
    bystanders: list[ProcEntry]  # vLLM processes that hold nothing on these GPUs
    ram_warning: str | None

    @property
    def clear_command(self) -> str:
        pids = " ".join(str(b.pid) for b in self.blockers)
        return f"kill {pids}   # then, for any still there after ~30 s: kill -9 {pids}"


def is_vllm_title(title: str, comm: str, prefix: str) -> bool:
    """vLLM's titles are `<prefix>::<Name>`; comm keeps only its first 15 bytes."""
    mark = f"{prefix}::"
    return title.startswith(mark) or (len(mark) > 0 and comm.startswith(mark[:15]))


def gpus_for_server(
    visible: str | None, indices: list[int], uuids: dict[str, int], tp: int
) -> list[int] | None:
    """NVML indices of the first ``tp`` CUDA devices under CUDA_VISIBLE_DEVICES (vLLM gives local
    rank r device r). Entries are indices or UUID prefixes; None when an entry maps to nothing.

    Assumes CUDA and NVML count devices in the same order, true on a host of identical GPUs
    (4x V100) and with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    if visible is None:
        order = list(indices)
    else:
        order = []
        for raw in visible.split(","):
            entry = raw.strip()
            if entry.isdigit() and int(entry) in indices:
                order.append(int(entry))
                continue
            match = [i for u, i in uuids.items() if entry and u.startswith(entry)]
            if len(match) != 1:
                return None
            order.append(match[0])
    return order[:tp]  # fewer GPUs than tp: the preflight's gpu.count says so


def judge(facts: GuardFacts) -> GuardVerdict:
    blockers: dict[int, Blocker] = {}
    vllm = {p.pid: p for p in facts.vllm_processes}
    unknown_why = _unknown_reason(facts)
    if unknown_why is None and facts.gpu_use is not None and facts.gpus_used is not None:
        for gpu in facts.gpu_use:
            if gpu.index not in facts.gpus_used:
                continue
            for pid, mib in sorted(gpu.holders.items()):
                held = f"{mib} MiB" if mib is not None else "memory"
                why = f"holds {held} on GPU {gpu.index}"
                if pid in blockers:
                    why = f"{blockers[pid].why}, {held} on GPU {gpu.index}"
                blockers[pid] = Blocker(pid, _command(pid, facts), why)
        state = "held" if blockers else "no other process"
        bystanders = [p for p in facts.vllm_processes if p.pid not in blockers]
    else:
        for pid, proc in sorted(vllm.items()):
            blockers[pid] = Blocker(pid, proc.command, "leftover vLLM process (GPU use unknown)")
        state = f"unknown ({unknown_why})"
        bystanders = []
    return GuardVerdict(
        blockers=sorted(blockers.values(), key=lambda b: b.pid),
        gpu_state=state,
        bystanders=bystanders,
        ram_warning=ram_warning(facts.mem_available_bytes, facts.checkpoint_bytes),
    )


def _unknown_reason(facts: GuardFacts) -> str | None:
    if facts.gpu_use is None:
        return f"NVML cannot say: {facts.nvml_error or 'no answer'}"
    if facts.gpus_used is None:
        return "CUDA_VISIBLE_DEVICES names a GPU NVML does not list"
    for gpu in facts.gpu_use:
        unlisted = not gpu.holders and (gpu.used_mib or 0) > UNLISTED_USE_LIMIT_MIB
        if gpu.index in facts.gpus_used and unlisted:
            return (
                f"GPU {gpu.index} has {gpu.used_mib} MiB in use but NVML names no process "
                "(another pid namespace?)"
            )
    return None


def _command(pid: int, facts: GuardFacts) -> str:
    return facts.commands.get(pid) or "not visible from here: another pid namespace or user"


def ram_warning(available_bytes: int | None, checkpoint_bytes: int | None) -> str | None:
    """Loading reads every shard through host memory (safetensors pages, TP ranks reading at
    once): with less available RAM than the checkpoint, the load swaps or the OOM killer
    takes a worker, which then looks like a hang or a crash of the engine."""
    if available_bytes is None or not checkpoint_bytes:
        return None
    if available_bytes >= checkpoint_bytes:
        return None
    return (
        f"host RAM available {available_bytes / 2**30:.1f} GiB is less than the checkpoint's "
        f"{checkpoint_bytes / 2**30:.1f} GiB: loading may swap or be OOM-killed"
    )


def summary_lines(verdict: GuardVerdict, prefix: str) -> list[str]:
    """What `up` says before it starts (the refusal itself is a ConflictError)."""
    lines = [f"guards: GPU memory holders on the server's GPUs: {verdict.gpu_state}"]
    if verdict.gpu_state.startswith("unknown") and not verdict.blockers:
        lines.append(f"guards: no leftover {prefix}:: process runs (counted instead)")
    for proc in verdict.bystanders:
        lines.append(
            f"note: pid {proc.pid} ({proc.title}) runs but holds nothing on the server's GPUs"
        )
    if verdict.ram_warning:
        lines.append(f"warning: {verdict.ram_warning}")
    return lines


def check_rows(verdict: GuardVerdict, prefix: str) -> list[CheckResult]:
    """`check`'s rows: gpu.leftover_processes (FAIL names every blocker by pid and command,
    WARN when GPU use is unknown) and checkpoint.host_ram (WARN with its reason)."""
    name = "gpu.leftover_processes"
    if verdict.blockers:
        shown = "; ".join(b.text() for b in verdict.blockers[:4])
        more = f" (and {len(verdict.blockers) - 4} more)" if len(verdict.blockers) > 4 else ""
        rows = [result(name, "FAIL", shown + more, f"stop them: {verdict.clear_command}")]
    elif verdict.gpu_state.startswith("unknown"):
        reason = f"GPU memory holders: {verdict.gpu_state}; no {prefix}:: process runs"
        rows = [result(name, "WARN", reason, "run `nvidia-smi` to see who holds GPU memory")]
    else:
        others = "".join(f"; pid {p.pid} ({p.title}) elsewhere" for p in verdict.bystanders)
        rows = [result(name, "PASS", f"no process holds memory on the server's GPUs{others}")]
    if verdict.ram_warning:
        fix = "free host memory, or expect a slow load"
        rows.append(result("checkpoint.host_ram", "WARN", verdict.ram_warning, fix))
    return rows
