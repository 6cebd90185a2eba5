"""The gpu checks: pure functions of Facts -> CheckResult (NVML facts: driver, devices)."""

from __future__ import annotations

from qpnserve.geometry import TP_SIZE
from qpnserve.preflight.facts import Facts, GpuDevice, GpuFacts, version_tuple
from qpnserve.preflight.report import CheckResult
from qpnserve.preflight.report import result as _r

V100_CC = "7.0"
# 32 GB V100s report ~32510 MiB through NVML; a 16 GB V100 cannot hold the TP4 shards plus KV.
MIN_MEMORY_MIB = 31 * 1024
# The host's wheels are CUDA 12.8 builds: a driver that supports CUDA 12.8 (>= 570) runs them
# natively; 12.0..12.7 drivers run them only through minor-version compatibility.
WANT_DRIVER_CUDA = (12, 8)
MIN_DRIVER_CUDA = (12, 0)


def visible_devices(gpu: GpuFacts) -> list[GpuDevice]:
    """The devices CUDA would expose, in order, under CUDA_VISIBLE_DEVICES: entries are indices
    or UUID prefixes; CUDA stops at the first entry that matches nothing."""
    if gpu.cuda_visible_devices is None:
        return list(gpu.devices)
    out: list[GpuDevice] = []
    for raw in gpu.cuda_visible_devices.split(","):
        entry = raw.strip()
        match = None
        if entry.isdigit():
            match = next((d for d in gpu.devices if d.index == int(entry)), None)
        elif entry:
            match = next((d for d in gpu.devices if d.uuid and d.uuid.startswith(entry)), None)
        if match is None:
            break
        out.append(match)
    return out


def check_gpu_driver(facts: Facts) -> CheckResult:
    gpu = facts.gpu
    name = "gpu.driver"
    if gpu is None:
        return _r(name, "SKIP", "GPU facts were not probed")
    if not gpu.nvml_ok:
        return _r(
            name,
            "FAIL",
            f"no NVIDIA driver reachable: {gpu.error}",
            "install the NVIDIA driver (>= 570 for CUDA 12.8) and check `nvidia-smi` works",
        )
    cuda = version_tuple(gpu.cuda_driver_version)
    found = f"driver {gpu.driver_version} (supports CUDA {gpu.cuda_driver_version})"
    if cuda is None or cuda < MIN_DRIVER_CUDA:
        return _r(name, "FAIL", f"{found}: too old for CUDA 12 builds", "upgrade to driver >= 570")
    if cuda < WANT_DRIVER_CUDA:
        return _r(
            name,
            "WARN",
            f"{found}: runs CUDA 12.8 builds only via minor-version compatibility (no PTX JIT)",
            "upgrade to driver >= 570 (CUDA 12.8)",
        )
    return _r(name, "PASS", found)


def _needs_nvml(facts: Facts, name: str) -> CheckResult | None:
    if facts.gpu is None:
        return _r(name, "SKIP", "GPU facts were not probed")
    if not facts.gpu.nvml_ok:
        return _r(name, "SKIP", "needs NVML (see gpu.driver)")
    return None


def check_gpu_count(facts: Facts, tp: int) -> CheckResult:
    name = "gpu.count"
    if (skip := _needs_nvml(facts, name)) is not None:
        return skip
    assert facts.gpu is not None
    visible = visible_devices(facts.gpu)
    cvd = facts.gpu.cuda_visible_devices
    where = f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""
    found = f"{len(visible)} visible GPU(s){where}, tensor parallel {tp} needs {tp}"
    if len(visible) < tp:
        fix = f"run on a host with {TP_SIZE} V100s, or fix CUDA_VISIBLE_DEVICES to list them"
        if tp != TP_SIZE:
            # qpnserve serves at TP 4 only: a host with more GPUs is not the remedy.
            fix = (
                f"use --tp {TP_SIZE}: qpnserve serves at tensor parallel {TP_SIZE}, "
                "one rank per V100"
            )
            if len(visible) < TP_SIZE:
                fix += f", and make {TP_SIZE} V100s visible (CUDA_VISIBLE_DEVICES)"
        return _r(name, "FAIL", found, fix)
    return _r(name, "PASS", found)


def check_gpu_compute_capability(facts: Facts, tp: int) -> CheckResult:
    name = "gpu.compute_capability"
    if (skip := _needs_nvml(facts, name)) is not None:
        return skip
    assert facts.gpu is not None
    used = visible_devices(facts.gpu)[:tp]
    if not used:
        return _r(name, "FAIL", "no visible GPU", "run on a host with Tesla V100 GPUs")
    wrong = [d for d in used if d.compute_capability != V100_CC]
    if wrong:
        listed = ", ".join(
            f"GPU {d.index} {d.name} (sm_{d.compute_capability.replace('.', '')})"
            for d in wrong[:4]
        )
        return _r(
            name,
            "FAIL",
            f"{listed}: the AWQ M1 route is built for compute capability 7.0 (Tesla V100) only",
            "run on Tesla V100 GPUs (sm_70)",
        )
    names = sorted({d.name for d in used})
    return _r(name, "PASS", f"{len(used)} x {', '.join(names)}, compute capability 7.0")


def check_gpu_memory(facts: Facts, tp: int) -> CheckResult:
    name = "gpu.memory"
    if (skip := _needs_nvml(facts, name)) is not None:
        return skip
    assert facts.gpu is not None
    used = visible_devices(facts.gpu)[:tp]
    if not used:
        return _r(name, "SKIP", "no visible GPU")
    smallest = min(used, key=lambda d: d.memory_total_mib)
    found = f"smallest GPU has {smallest.memory_total_mib / 1024:.1f} GiB"
    if smallest.memory_total_mib < MIN_MEMORY_MIB:
        return _r(
            name,
            "WARN",
            f"{found}: below 32 GB, the Qwen3.8 AWQ weights at TP{tp} leave little for KV cache",
            "use 32 GB V100s, or lower --max-model-len / --max-num-seqs",
        )
    return _r(name, "PASS", f"{found} (>= 32 GB per GPU)")
