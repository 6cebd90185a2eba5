"""bench op beside a native host's own op, on a CPU with a STAND-IN registered via torch.library.

The stand-in is not the host's op: it is the FP64 reference rounded (or deliberately wrong),
registered under a test namespace with the host op's name and schema, so the lookup, the FP64
check before timing and the report are exercised without ReVolta or a GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from qpnserve.benchop import hostop
from qpnserve.benchop.report import render_table
from qpnserve.benchop.runner import BenchConfig, run_bench
from tests.bench_op.conftest import make_ops, reference_op

CPU = torch.device("cpu")
SCHEMA = (
    "(Tensor(a!) out, Tensor(b!) intermediate, Tensor x, Tensor w13, Tensor s13, Tensor w2, "
    "Tensor s2, Tensor ids, Tensor weights) -> ()"
)


def _wrong(out, intermediate, *args) -> None:
    reference_op(out, intermediate, *args)
    out[0, 5] += 0.05 * float(out.abs().max()) + 0.01


@pytest.fixture(scope="module")
def standin_ns() -> str:
    """Two stand-ins: a right one and a wrong one, in namespaces no real library uses."""
    libs = []
    for ns, impl in (("qpnserve_standin_right", reference_op), ("qpnserve_standin_wrong", _wrong)):
        lib = torch.library.Library(ns, "DEF")
        lib.define(hostop.HOST_OP + SCHEMA)
        lib.impl(hostop.HOST_OP, impl, "CPU")
        libs.append(lib)
    yield "qpnserve_standin"
    for lib in libs:
        lib._destroy()


def test_lookup_finds_only_a_registered_host_op(standin_ns: str) -> None:
    assert hostop.lookup(f"{standin_ns}_right") is not None
    assert hostop.lookup("qpnserve_standin_nothing_here") is None


def test_host_op_is_absent_without_vllm(monkeypatch) -> None:
    monkeypatch.setattr(hostop.importlib.util, "find_spec", lambda _name: None)
    op, note = hostop.find_host_op()
    assert op is None and note.startswith("host op absent: no vllm here")


def test_bench_times_the_host_op_beside_ours_after_checking_it(
    small_config: BenchConfig, standin_ns: str
) -> None:
    ops = replace(make_ops(), host_op=hostop.lookup(f"{standin_ns}_right"))
    report = run_bench(replace(small_config, layers=2), ops, CPU)
    assert report.host_op is not None
    assert report.host_op.verified.startswith("all 2 layers within contract bounds")
    # Scripted ms per replay cycle over 12 values; the host op is the 15th recording (0.200 ms
    # per 2 layers = 100 us a layer, derive 1 us): net 99 us against the op's net 4 us.
    assert report.host_op.net_us == pytest.approx(99.0)
    assert report.ratios.host_op_to_op == pytest.approx(99.0 / 4.0)
    assert "host_op" in render_table(report) and "host op 24.75x op" in render_table(report)


def test_bench_reports_a_wrong_host_op_without_timing_it(
    small_config: BenchConfig, standin_ns: str
) -> None:
    ops = replace(make_ops(), host_op=hostop.lookup(f"{standin_ns}_wrong"))
    report = run_bench(small_config, ops, CPU)
    assert report.host_op is None and report.ratios.host_op_to_op is None
    assert any(
        n.startswith("host op not timed: host op: layer 0 output is wrong") for n in report.notes
    )
    assert report.op.net_us > 0  # ours is still reported
