"""The real effects of `bench op` on a CUDA device: kernels, graph timing, copy, device facts."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from qpnserve.benchop import hostop
from qpnserve.benchop.report import DeviceFacts
from qpnserve.benchop.runner import BenchOps
from qpnserve.errors import BenchError

COPY_BYTES = 1 << 30  # far above the 60 MB L2 of an H200 (6 MB on a V100)


class GraphTimer:
    """Captures each recorded step once into a CUDA graph, then times replays with events.

    Returns one time per replay (ms). All replays are queued before one synchronisation, so
    the GPU never waits for the host between them.
    """

    def __init__(self) -> None:
        self._graphs: dict[int, tuple[Callable[[], None], torch.cuda.CUDAGraph]] = {}

    def _graph(self, record: Callable[[], None]) -> torch.cuda.CUDAGraph:
        cached = self._graphs.get(id(record))
        if cached is not None and cached[0] is record:
            return cached[1]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (library handles, workspaces)
            record()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            record()
        self._graphs[id(record)] = (record, graph)
        return graph

    def __call__(self, record: Callable[[], None], iters: int, warmup: int) -> list[float]:
        graph = self._graph(record)
        for _ in range(warmup):
            graph.replay()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]


def copy_gb_s(device: torch.device, repeats: int = 10) -> float:
    """A large device-to-device copy: (bytes read + bytes written) / median time."""
    src = torch.ones(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times_ms = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    del src, dst
    return 2 * COPY_BYTES / (statistics.median(times_ms) * 1e-3) / 1e9


def git_commit(recorded: str | None) -> str:
    """``recorded`` ($QPNSERVE_GIT_COMMIT), else the checkout's HEAD (with +dirty), else
    'unknown'."""
    if recorded:
        return recorded
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def device_facts(device: torch.device, recorded_commit: str | None) -> DeviceFacts:
    props = torch.cuda.get_device_properties(device)
    facts = DeviceFacts(
        gpu_name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        l2_mib=getattr(props, "L2_cache_size", 0) / 2**20,
        mem_gib=props.total_memory / 2**30,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        git_commit=git_commit(recorded_commit),
    )
    try:  # clocks are best effort: NVML may be missing or restricted
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            facts.sm_clock_mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            facts.mem_clock_mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            facts.max_sm_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            facts.max_mem_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(
                handle, pynvml.NVML_CLOCK_MEM
            )
            driver = pynvml.nvmlSystemGetDriverVersion()
            facts.driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    return facts


# qpnserve.kernels.ops PATH_*: the device's default, or the V100 design on any GPU.
OP_PATHS = {"auto": 0, "v100": 1}


def pinned_path_label(op_path: str, gpu_name: str, capability: tuple[int, int]) -> str | None:
    """What the op's figures are when its path is pinned to the V100 design: on any GPU but a
    V100 (sm_70) they time that design's code on another chip, never a V100 speed."""
    if op_path != "v100":
        return None
    if capability == (7, 0):
        return f"op: the V100 design on a {gpu_name} (this GPU's default path)"
    return f"op: the V100 design on an {gpu_name} (not a V100 speed)"


def cuda_ops(
    device: torch.device,
    load_extension: Callable[[], object],
    op_path: str = "auto",
    recorded_commit: str | None = None,
) -> BenchOps:
    """Load the extension (op, floor, derive) and wire the real measurements.

    recorded_commit: $QPNSERVE_GIT_COMMIT from the settings (a copy without .git).
    op_path pins the op's path (OP_PATHS): "v100" runs the V100 design on any GPU (on a newer
    GPU that is the V100 design's correctness and its time there, not a V100's speed).
    """
    if not torch.cuda.is_available():
        raise BenchError(
            "bench op needs a CUDA GPU, and torch sees none",
            hint="run it on the GPU host, with a CUDA build of torch",
        )
    load_extension()
    ns = torch.ops.qpnserve
    for name in ("awq_moe_m1_out", "read_floor_m1", "derive_input_m1"):
        if not hasattr(ns, name):
            raise BenchError(
                f"the loaded extension has no torch.ops.qpnserve.{name}",
                hint="rebuild it from this checkout: qpnserve build --force",
            )
    op: Callable[..., None] = ns.awq_moe_m1_out
    notes = []
    if op_path != "auto":
        path = OP_PATHS[op_path]
        pinned = ns.awq_moe_m1_out_path

        def op(*args: torch.Tensor) -> None:
            pinned(*args, path)

        notes.append(f"op path pinned to {op_path} (awq_moe_m1_out_path, path={path})")
        label = pinned_path_label(
            op_path, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        )
        if label:
            notes.append(label)
    timer = GraphTimer()
    host_op, host_note = hostop.find_host_op()
    if host_op is None:
        notes.append(host_note)  # found: its row in the table says so
    return BenchOps(
        op=op,
        host_op=host_op,
        notes=notes,
        floor=ns.read_floor_m1,
        derive=ns.derive_input_m1,
        timer=timer,
        copy_gb_s=lambda: copy_gb_s(device),
        facts=lambda: device_facts(device, recorded_commit),
        pdl_supported=torch.cuda.get_device_capability(device)[0] >= 9,
    )
