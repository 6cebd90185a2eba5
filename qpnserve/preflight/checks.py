"""The machine checks, by group. Each check is a pure function of Facts -> CheckResult that
states what it found in one line and, when it is not a PASS, one line of what to do; thresholds
carry their reason beside them (checks_gpu.py, checks_toolchain.py; the checkpoint's in
checks_checkpoint.py, checks_config.py and checks_tensors.py).
"""

from __future__ import annotations

from qpnserve.preflight.checks_gpu import (
    check_gpu_compute_capability,
    check_gpu_count,
    check_gpu_driver,
    check_gpu_memory,
    visible_devices,
)
from qpnserve.preflight.checks_toolchain import (
    check_host,
    check_host_env,
    check_nvcc,
    check_route_flag,
    check_torch,
    check_torch_arch,
)
from qpnserve.preflight.facts import Facts
from qpnserve.preflight.report import CheckResult

__all__ = [
    "check_gpu_compute_capability",
    "check_gpu_count",
    "check_gpu_driver",
    "check_gpu_memory",
    "check_host",
    "check_host_env",
    "check_nvcc",
    "check_route_flag",
    "check_torch",
    "check_torch_arch",
    "machine_checks",
    "visible_devices",
]


def machine_checks(facts: Facts, groups: set[str], tp: int, awq_m1: bool) -> list[CheckResult]:
    out: list[CheckResult] = []
    if "gpu" in groups:
        out += [
            check_gpu_driver(facts),
            check_gpu_count(facts, tp),
            check_gpu_compute_capability(facts, tp),
            check_gpu_memory(facts, tp),
        ]
    if "toolchain" in groups:
        out += [
            check_torch(facts),
            check_torch_arch(facts),
            check_nvcc(facts),
            check_host(facts, awq_m1),
            check_host_env(facts, awq_m1),
            check_route_flag(facts),
        ]
    return out
