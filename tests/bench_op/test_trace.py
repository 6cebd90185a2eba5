"""`bench op --trace`: the per-CTA summary from made-up stamps, and the traced copy on a GPU."""

from __future__ import annotations

import pytest

from qpnserve.benchop import trace

# Two CTAs, 1 cycle per ns (1 GHz): start, w2_issued, strip_done, arrived, exited, end.
CTA_A = [(0, 0), (1000, 1000), (1500, 1500), (1600, 1600), (2600, 2600), (5000, 5000)]
CTA_B = [(100, 50), (1200, 1150), (1900, 1850), (2500, 2450), (2700, 2650), (4800, 4750)]


def test_call_summary_reads_the_barrier_from_the_stamps() -> None:
    got = trace.call_summary([CTA_A, CTA_B], with_barrier=True)
    assert got["span_ns"] == 5000
    assert got["start_spread_ns"] == 100
    assert got["arrival_spread_ns"] == 900  # 2500 - 1600
    assert got["release_ns"] == 100  # first exit 2600 - last arrival 2500
    assert got["exit_spread_ns"] == 100
    assert got["strip_after_w2_issue_cycles"] == (500 + 700) / 2
    assert got["arrive_cost_cycles"] == (100 + 600) / 2
    assert got["sm_clock_ghz"] == pytest.approx(1.0)


def test_findings_subtract_the_runs_without_the_barrier() -> None:
    def scenario(span: float, **extra: float) -> dict[str, object]:
        return {"summary": {"span_ns": span, **extra}}

    got = trace.findings(
        {
            "routed/barrier": scenario(25_000, release_ns=300.0, arrival_spread_ns=2000.0),
            "routed/no_barrier": scenario(24_600),
            "all_invalid/barrier": scenario(3_000, release_ns=250.0),
            "all_invalid/no_barrier": scenario(1_800),
        }
    )
    assert got["barrier_exposed_ns"] == 400
    assert got["barrier_fixed_ns"] == 1200
    assert got["release_ns"] == 300.0 and got["empty_release_ns"] == 250.0


def test_run_trace_runs_four_scenarios_and_keeps_warm_up_out() -> None:
    calls: list[tuple[str, bool]] = []

    def fake_call(layer: object, with_barrier: bool) -> list[list[tuple[int, int]]]:
        calls.append((str(layer), with_barrier))
        return [CTA_A, CTA_B]

    result = trace.run_trace(fake_call, ["L0", "L1"], ["E"], repeats=3)
    assert list(result["scenarios"]) == [
        "routed/barrier",
        "routed/no_barrier",
        "all_invalid/barrier",
        "all_invalid/no_barrier",
    ]
    assert result["scenarios"]["routed/barrier"]["calls"] == 6  # 3 repeats x 2 layers
    assert result["scenarios"]["all_invalid/barrier"]["calls"] == 3
    assert len(calls) == 2 * (2 + 6) + 2 * (1 + 3)  # a warm-up pass per scenario
    assert result["findings"]["barrier_exposed_ns"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
@pytest.mark.usefixtures("cuda_extension", "bench_extension")
def test_gpu_traced_copy_computes_the_op_and_stamps_in_order(fmt: str) -> None:
    import torch

    from qpnserve.benchop.banks import make_layer
    from qpnserve.benchop.cuda import traced_call

    device = torch.device("cuda")
    layer = make_layer(fmt, torch.Generator(device=device).manual_seed(3), device)
    stamps = traced_call(device)(layer, True)
    assert len(stamps) == 80
    for cta in stamps:
        times = [ns for ns, _ in cta]
        assert times == sorted(times) and times[0] > 0, cta
    # The barrier: no CTA exits before the last one arrived.
    assert max(c[3][0] for c in stamps) <= min(c[4][0] for c in stamps)
    # The traced copy computes what the operator does, bit for bit.
    out = torch.empty(1, 2560, dtype=torch.float16, device=device)
    inter = torch.empty(10, 160, dtype=torch.float16, device=device)
    args = (layer.seed, layer.w13, layer.s13, layer.w2, layer.s2, layer.route_ids,
            layer.route_weights)  # fmt: skip
    torch.ops.qpnserve.awq_moe_m1_out(out, inter, *args)
    t_out, t_inter = torch.empty_like(out), torch.empty_like(inter)
    trace_buf = torch.zeros(80, 6, 2, dtype=torch.int64, device=device)
    torch.ops.qpnserve_bench.awq_moe_m1_traced(t_out, t_inter, *args, trace_buf, False)
    assert torch.equal(out.view(torch.int16), t_out.view(torch.int16))
    assert torch.equal(inter.view(torch.int16), t_inter.view(torch.int16))
