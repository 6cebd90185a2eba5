"""The order of checks in `bench op`, on a CPU with fake kernels (no timing is asserted)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from qpnserve.benchop.runner import BenchConfig, l2_reuse_note, run_bench
from qpnserve.errors import BenchError, CanaryError
from tests.bench_op.conftest import ScriptedTimer, facts, make_ops, python_floor, reference_op

CPU = torch.device("cpu")


def test_bench_reports_ratios_from_scripted_times(small_config: BenchConfig) -> None:
    report = run_bench(replace(small_config, layers=2), make_ops(), CPU)
    # Per layer (2 layers): derive 1 us, op 5 us, fastest floor 3 us (net 4 and 2).
    assert report.derive_us == pytest.approx(1.0)
    assert report.op.net_us == pytest.approx(4.0)
    assert report.floor.net_us == pytest.approx(2.0)
    assert report.ratios.op_to_floor == pytest.approx(2.0)
    assert report.floor.what.startswith("read_floor_m1, fastest variant: 8 x 16 B")
    assert report.route_bytes.per_call == 7_680_000
    assert report.op.effective_gb_s == pytest.approx(7_680_000 / 4.0 / 1e3)
    assert [v.loads_per_thread for v in report.floor_variants] == [2, 4, 8, 16] * 2
    assert [v.cache_hint for v in report.floor_variants] == [0] * 4 + [1] * 4
    doc = report.model_dump(mode="json")
    fields = {"loads_per_thread", "cache_hint", "layer_median_us", "net_us", "error"}
    assert doc["schema_version"] == 2  # version 1's floor variants also had `pdl`
    assert all(set(v) == fields for v in doc["floor_variants"])
    assert report.op.verified.startswith("all 2 layers within contract bounds")
    assert report.empty_routes is not None  # timed after the floors: scripted 0.002 and 0.010
    assert report.empty_routes.op_net_us == pytest.approx(0.0)
    assert report.empty_routes.floor_net_us == pytest.approx(4.0)


def test_bench_refuses_to_time_op_with_wrong_output(small_config: BenchConfig) -> None:
    def wrong_op(out, intermediate, *args) -> None:
        reference_op(out, intermediate, *args)
        out[0, 100] += 0.05 * float(out.abs().max()) + 0.01

    timer = ScriptedTimer([0.001])
    with pytest.raises(CanaryError, match="op: layer 0 output is wrong"):
        run_bench(small_config, make_ops(op=wrong_op, timer=timer), CPU)
    assert timer.calls == 0  # nothing was timed


def test_bench_refuses_op_with_wrong_intermediate(small_config: BenchConfig) -> None:
    def wrong_h(out, intermediate, *args) -> None:
        reference_op(out, intermediate, *args)
        intermediate[3, 7] += 0.01 * float(intermediate.abs().max()) + 0.01

    timer = ScriptedTimer([0.001])
    with pytest.raises(CanaryError, match="layer 0 output is wrong \\(intermediate: max ulps"):
        run_bench(small_config, make_ops(op=wrong_h, timer=timer), CPU)
    assert timer.calls == 0


def test_bench_refuses_op_whose_replay_differs_from_eager(small_config: BenchConfig) -> None:
    calls = {"n": 0}

    def drifting_op(out, intermediate, x, w13, s13, w2, s2, ids, weights) -> None:
        reference_op(out, intermediate, x, w13, s13, w2, s2, ids, weights)
        if bool((ids < 0).all()):
            return
        calls["n"] += 1
        if calls["n"] > 1:  # right in the (one-layer) eager check, then not
            out.view(torch.int16)[0, 0] += 1

    with pytest.raises(CanaryError, match="differs between CUDA-graph replay and eager"):
        run_bench(small_config, make_ops(op=drifting_op), CPU)


def test_bench_rejects_floor_that_skips_a_route(small_config: BenchConfig) -> None:
    def lazy_floor(sink, w13, s13, w2, s2, ids, loads, hint) -> None:
        python_floor(sink, w13, s13, w2, s2, ids[:, :9].contiguous(), loads, hint)

    with pytest.raises(BenchError, match="no read-floor variant read the routed bytes"):
        run_bench(small_config, make_ops(floor=lazy_floor), CPU)


def test_bench_drops_only_the_floor_variant_that_misreads(small_config: BenchConfig) -> None:
    def one_bad_variant(sink, w13, s13, w2, s2, ids, loads, hint) -> None:
        subset = ids[:, :9].contiguous() if (loads, hint) == (8, 1) else ids
        python_floor(sink, w13, s13, w2, s2, subset, loads, hint)

    report = run_bench(small_config, make_ops(floor=one_bad_variant), CPU)
    bad = [v for v in report.floor_variants if v.error]
    assert [(v.loads_per_thread, v.cache_hint) for v in bad] == [(8, 1)]
    assert bad[0].net_us is None and "did not read the routed bytes" in (bad[0].error or "")


def test_bench_checks_3byte_banks_too() -> None:
    cfg = BenchConfig(fmt="3byte", layers=1, iters=2, rounds=1, warmup=0, num_experts=12)
    assert {v.cache_hint for v in cfg.floor_variants} == {0}  # the prefetch hint is opt-in
    report = run_bench(cfg, make_ops(), CPU)
    assert report.route_bytes.per_call == 7_296_000
    assert report.torch_route.verified.startswith("all 1 layers within contract bounds")
    assert report.dense_fp16.verified.startswith("all 1 layers within contract bounds")


def test_bench_rejects_non_positive_layers() -> None:
    with pytest.raises(BenchError):
        run_bench(BenchConfig(layers=0, num_experts=12), make_ops(), CPU)


def test_bench_refuses_op_that_writes_nonzero_for_all_invalid_ids(small_config) -> None:
    def leaky_op(out, intermediate, x, w13, s13, w2, s2, ids, weights) -> None:
        reference_op(out, intermediate, x, w13, s13, w2, s2, ids, weights)
        if bool((ids < 0).all()):
            out[0, 0] = 1.0

    with pytest.raises(CanaryError, match="all ids invalid is not all zero"):
        run_bench(small_config, make_ops(op=leaky_op), CPU)


def test_bench_report_json_round_trips_with_the_issue_fields(small_config: BenchConfig) -> None:
    import json

    from qpnserve.benchop.report import BenchOpReport

    report = run_bench(small_config, make_ops(), CPU)
    text = report.model_dump_json()
    data = json.loads(text)
    for key in ("op", "floor", "torch_route", "dense_fp16", "ratios", "device", "copy_gb_s"):
        assert key in data
    for key in ("op_to_floor", "op_copy_fraction", "torch_route_to_op", "dense_fp16_to_op"):
        assert key in data["ratios"]
    assert {"gpu_name", "torch_version", "cuda_version", "git_commit"} <= set(data["device"])
    assert BenchOpReport.model_validate_json(text) == report


def test_l2_reuse_note_names_the_layers_that_avoid_it() -> None:
    # H200: 60 MiB of L2, 7.68 MB routed per call (4-byte).
    note = l2_reuse_note(8, 7_680_000, 60.0)
    assert note is not None
    assert "61 MB per replay" in note and "--layers 25 or more" in note
    assert l2_reuse_note(24, 7_680_000, 60.0) is not None
    assert l2_reuse_note(25, 7_680_000, 60.0) is None
    assert l2_reuse_note(1, 7_680_000, 0.0) is None  # L2 size unknown: no claim either way


def test_bench_report_carries_the_l2_reuse_note(small_config: BenchConfig) -> None:
    ops = make_ops()
    ops.facts = lambda: facts().model_copy(update={"l2_mib": 60.0})
    report = run_bench(small_config, ops, CPU)
    assert any("less than 3x the 60 MiB L2" in n for n in report.notes)
    assert not any("L2" in n for n in run_bench(small_config, make_ops(), CPU).notes)
