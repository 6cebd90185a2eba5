"""CPU fakes for `bench op`: a correct op (the FP64 reference, rounded), a wrong one, a Python
read floor and a timer that runs each recorded step once and returns scripted times."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from qpnserve.benchop.banks import LayerBanks, floor_expected_sum
from qpnserve.benchop.contenders import derive_torch
from qpnserve.benchop.report import DeviceFacts
from qpnserve.benchop.runner import BenchConfig, BenchOps, floor_variants
from qpnserve.kernels import reference

NUM_EXPERTS = 12  # the op's geometry per expert, with few experts so the CPU copes


def reference_op(out, intermediate, x, w13, s13, w2, s2, ids, weights) -> None:
    want_out, want_h = reference.oracle_fp64(x, w13, s13, w2, s2, ids, weights)
    out.copy_(want_out)
    intermediate.copy_(want_h)


def python_floor(sink, w13, s13, w2, s2, ids, loads_per_thread, cache_hint) -> None:
    banks = LayerBanks(w13, s13, w2, s2, ids, ids, ids)
    total = floor_expected_sum(banks, ids)
    sink.zero_()
    sink[0] = total - (1 << 32) if total >= 1 << 31 else total


class ScriptedTimer:
    """Runs record() once per call (so fakes see replays) and returns scripted ms per replay."""

    def __init__(self, per_call_ms: list[float]) -> None:
        self.per_call_ms = per_call_ms
        self.calls = 0

    def __call__(self, record: Callable[[], None], iters: int, warmup: int) -> list[float]:
        record()
        value = self.per_call_ms[self.calls % len(self.per_call_ms)]
        self.calls += 1
        return [value] * iters


def facts() -> DeviceFacts:
    return DeviceFacts(
        gpu_name="fake",
        compute_capability="0.0",
        sm_count=1,
        l2_mib=0.0,
        mem_gib=0.0,
        torch_version=torch.__version__,
        cuda_version=None,
        git_commit="test",
    )


@pytest.fixture
def small_config() -> BenchConfig:
    return BenchConfig(
        fmt="4byte",
        layers=1,
        iters=3,
        rounds=1,
        warmup=0,
        num_experts=NUM_EXPERTS,
        floor_variants=floor_variants((0, 1)),
    )


def make_ops(op=reference_op, floor=python_floor, timer=None) -> BenchOps:
    # derive, op, torch route, dense, then the eight floor variants (ms per replay).
    per_call = [0.002, 0.010, 0.200, 0.030, 0.008, 0.007, 0.006, 0.009]
    timer = timer or ScriptedTimer([*per_call, 0.0085, 0.0075, 0.0065, 0.0095])
    return BenchOps(
        op=op,
        floor=floor,
        derive=derive_torch,
        timer=timer,
        copy_gb_s=lambda: 4000.0,
        facts=facts,
    )
