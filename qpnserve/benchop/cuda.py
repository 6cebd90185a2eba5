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


def design_label(gpu_name: str, capability: tuple[int, int]) -> str:
    """What the op's figures are: the V100 design is the one CUDA form on every GPU, and only on
    a V100 (sm_70) is its time a V100's."""
    if capability == (7, 0):
        return f"op: the V100 design on a {gpu_name}"
    return f"op: the V100 design on an {gpu_name} (m8n8k4 emulated there; not a V100 speed)"


def cuda_ops(
    device: torch.device,
    load_extension: Callable[[], object],
    load_bench_extension: Callable[[], object],
    recorded_commit: str | None = None,
) -> BenchOps:
    """Load the operator and the bench extension (floor, derive) and wire the measurements.

    recorded_commit: $QPNSERVE_GIT_COMMIT from the settings (a copy without .git)."""
    if not torch.cuda.is_available():
        raise BenchError(
            "bench op needs a CUDA GPU, and torch sees none",
            hint="run it on the GPU host, with a CUDA build of torch",
        )
    load_extension()
    load_bench_extension()
    op_ns, bench_ns = torch.ops.qpnserve, torch.ops.qpnserve_bench
    for ns, name in ((op_ns, "awq_moe_m1_out"), (bench_ns, "read_floor_m1"),
                     (bench_ns, "derive_input_m1")):  # fmt: skip
        if not hasattr(ns, name):
            raise BenchError(
                f"the loaded extensions have no torch.ops.{ns.name}.{name}",
                hint="rebuild them from this checkout: qpnserve build --force",
            )
    notes = [
        design_label(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    ]
    timer = GraphTimer()
    host_op, host_note = hostop.find_host_op()
    if host_op is None:
        notes.append(host_note)  # found: its row in the table says so
    return BenchOps(
        op=op_ns.awq_moe_m1_out,
        host_op=host_op,
        notes=notes,
        floor=bench_ns.read_floor_m1,
        derive=bench_ns.derive_input_m1,
        timer=timer,
        copy_gb_s=lambda: copy_gb_s(device),
        facts=lambda: device_facts(device, recorded_commit),
    )


def traced_call(device: torch.device) -> Callable[[object, bool], list[list[tuple[int, int]]]]:
    """One call of the bench extension's traced op on a layer's banks -> its per-CTA stamps
    (benchop.trace.Stamps). The bench extension must be loaded."""
    from qpnserve.benchop.banks import LayerBanks
    from qpnserve.geometry import HIDDEN, INTERMEDIATE, TOP_K

    traced = torch.ops.qpnserve_bench.awq_moe_m1_traced
    out = torch.empty(1, HIDDEN, dtype=torch.float16, device=device)
    inter = torch.empty(TOP_K, INTERMEDIATE, dtype=torch.float16, device=device)
    stamps = torch.zeros(80, 6, 2, dtype=torch.int64, device=device)

    def call(layer: object, with_barrier: bool) -> list[list[tuple[int, int]]]:
        assert isinstance(layer, LayerBanks)
        traced(out, inter, layer.seed, layer.w13, layer.s13, layer.w2, layer.s2,
               layer.route_ids, layer.route_weights, stamps, not with_barrier)  # fmt: skip
        rows = stamps.cpu().tolist()
        return [[(int(ns), int(cyc)) for ns, cyc in cta] for cta in rows]

    return call
