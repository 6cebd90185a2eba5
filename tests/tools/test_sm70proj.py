"""tools/sm70proj: SASS reading, the V100 model's arithmetic, and the host's real kernels."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tools.sm70proj import builds, model, sass, tables

ROOT = Path(__file__).resolve().parents[2]

# A made-up listing in cuobjdump's layout: ids (parameter 3) first, then a weight word
# (parameter 1) whose address derives from the id, a metadata word (parameter 2), an epilogue.
LISTING = """
        Function : _Z6kernelPKjS0_S0_PKi
        /*0000*/                   IMAD.MOV.U32 R3, RZ, RZ, 0x4 ;          /* 0x000 */
        /*0010*/                   IMAD.WIDE R2, R0, R3, c[0x0][0x178] ;   /* 0x000 */
        /*0020*/                   LDG.E.CONSTANT.SYS R50, [R2] ;          /* 0x000 */
        /*0030*/                   ISETP.GT.U32.AND P0, PT, R50, 0x1ff, PT ;
        /*0040*/                   IMAD.WIDE R8, R50, 0x100, RZ ;
        /*0050*/                   LEA R4, P1, R8, c[0x0][0x168], 0x2 ;
        /*0060*/                   LDG.E.EF.SYS R33, [R4] ;
        /*0070*/                   IMAD.WIDE R6, R50, R3, c[0x0][0x170] ;
        /*0080*/                   @!P0 LDG.E.128.SYS R12, [R6] ;
        /*0090*/                   LOP3.LUT R22, R33, 0xf000f, RZ, 0xc0, !PT ;
        /*00a0*/                   HADD2 R20, R22, R13 ;
        /*00b0*/                   STG.E.SYS [R2], R20 ;
        /*00c0*/                   EXIT ;
"""


@pytest.fixture(scope="module")
def instrs() -> list[str]:
    listing = sass.parse_listing(LISTING)
    assert list(listing) == ["_Z6kernelPKjS0_S0_PKi"]
    return listing["_Z6kernelPKjS0_S0_PKi"]


def test_sass_classifies_predicated_instructions() -> None:
    assert sass.opcode("@!P0 LDG.E.128.SYS R4, [R2]") == "LDG.E.128.SYS"
    assert sass.kind_of("@!P0 LDG.E.128.SYS R4, [R2]") == "load_global"
    assert sass.kind_of("HMMA.884.F32.F32.STEP0 R8, R20.ROW, R22.COL, R8") == "hmma"
    assert sass.kind_of("F2F.F16.F32 R3, R2") == "conversion"


def test_sass_counts_loads_outstanding_until_first_use() -> None:
    listing = [
        "LDG.E.128.SYS R4, [R2]",
        "LDG.E.128.SYS R8, [R2+0x10]",
        "LDG.E.SYS R12, [R2+0x20]",
        "IADD3 R1, R1, 0x1, RZ",  # reads no loaded register
        "LOP3.LUT R20, R5, 0xf, RZ, 0xc0, !PT",  # first use of the first load
        "LDG.E.128.SYS R24, [R2+0x30]",
    ]
    assert sass.max_loads_in_flight(listing) == (3, 36)


def test_sass_traces_each_load_to_the_parameter_its_address_comes_from(instrs) -> None:
    # The id load reads parameter 3; the weight address mixes the id with parameter 1, and the
    # parameter named in the instruction itself wins.
    assert sass.load_params(instrs) == [3, 1, 2]


def test_sass_counts_dram_loads_only_when_asked(instrs) -> None:
    assert sass.loads_in_flight(instrs, {1, 2}) == (2, 20)
    assert sass.loads_in_flight(instrs, None) == (2, 20)  # the id was used before
    assert sass.listed_bytes(instrs, {1, 2}) == 20
    assert sass.prologue_trips(instrs, {1, 2}) == 1  # the id, before the first DRAM load
    assert sass.param_of_each(instrs)[:9] == [None, None, 3, None, None, None, 1, None, 2]


def test_res_usage_parses_registers_shared_and_local() -> None:
    text = (
        " Function _Z1kv:\n"
        "  REG:56 STACK:0 SHARED:2048 LOCAL:0 CONSTANT[0]:392 TEXTURE:0 SURFACE:0\n"
    )
    assert builds.parse_res_usage(text) == {"_Z1kv": (56, 2048, 0)}


def test_v100_occupancy_is_register_limited() -> None:
    # 56 registers x 512 threads: 1792 per warp, 28,672 per CTA: two fit in 65,536.
    assert model.occupancy(56, 512, 2048) == (2, 32)
    # 66 registers round up to 2304 per warp: one 512-thread CTA per SM.
    assert model.occupancy(66, 512, 2048) == (1, 16)


def _kernel(regs: int, in_flight: int) -> model.NodeTerms:
    k = model.Kernel("k", "k", 100, 512, 5_120_000, (1, 2))
    s = model.SassStats(regs, 2048, 600, in_flight, 100, 1, 100)  # the listing runs once
    return model.project_node(k, s, latency_us=0.6, launch_gap_us=0.0)


def test_model_runs_a_second_wave_when_the_grid_does_not_fit() -> None:
    one, two = _kernel(56, 12), _kernel(66, 12)
    assert one.limiter.startswith("bandwidth") and "waves" not in one.limiter
    assert two.limiter == "latency rounds, 2 waves"
    # 80 CTAs stream 80% of the bytes at the ceiling, then the last 20 repeat the whole chain
    # of latency rounds alone (100 B per thread / 12 B in flight).
    assert two.stream_us == pytest.approx(0.6 + 0.8 * 5.12 / 0.85 + 100 / 12 * 0.6)


def test_model_is_latency_bound_with_few_bytes_in_flight() -> None:
    slow = _kernel(56, 4)
    assert slow.limiter == "latency rounds"
    assert slow.stream_us == pytest.approx(25 * 0.6)


def test_work_before_the_first_wait_hides_behind_the_real_bytes_unless_longer() -> None:
    k = model.Kernel("one", "one", 80, 320, 7_680_000, (3, 4, 5, 6))
    base = model.SassStats(128, 0, 2300, 300, 300, 1, 180)
    # 32,000 B of W2 per CTA still arriving: 3.01 us at 850/80 GB/s per SM.
    hidden = model.project_node(k, replace(base, epilogue_overlap_instructions=700,
                                           tail_bytes_per_cta=32_000), 0.6, 3.0)  # fmt: skip
    assert hidden.epilogue_us == pytest.approx(model.project_node(k, base, 0.6, 3.0).epilogue_us)
    # 4,000 dependent instructions (11.6 us) outlast those bytes: the excess is exposed.
    longer = model.project_node(k, replace(base, epilogue_overlap_instructions=4000,
                                           tail_bytes_per_cta=32_000), 0.6, 3.0)  # fmt: skip
    excess = 4000 * 4 / 1380 - 32_000 / (850e3 / 80)
    assert longer.epilogue_us - hidden.epilogue_us == pytest.approx(excess)


def test_a_hand_off_before_the_first_wait_hides_in_the_window() -> None:
    k = model.Kernel("one", "one", 80, 320, 7_680_000, (3, 4, 5, 6), handoffs=1)
    base = model.SassStats(128, 0, 2300, 300, 300, 1, 180, tail_bytes_per_cta=32_000)
    after = model.project_node(k, base, 0.6, 3.0)
    inside = model.project_node(k, replace(base, handoff_in_overlap=True), 0.6, 3.0)
    handoff = 2 * 193 / 1380 + 0.5
    # Inside the window, only the poll that sees the flip (one L2 read) stays exposed.
    assert after.epilogue_us - inside.epilogue_us == pytest.approx(handoff - 193 / 1380)


def test_a_bubble_pays_its_chain_its_l2_trips_and_one_refill_latency() -> None:
    k = model.Kernel("one", "one", 80, 320, 7_680_000, (3, 4, 5, 6))
    base = model.SassStats(128, 0, 2300, 300, 300, 1, 180)
    plain = model.project_node(k, base, 0.6, 3.0)
    bubbled = model.project_node(
        k, replace(base, bubble_instructions=345, bubble_l2_trips=1, bubbles=1), 0.6, 3.0
    )
    assert bubbled.bubble_us == pytest.approx((345 * 4 + 193) / 1380 + 0.6)
    assert bubbled.total_us - plain.total_us == pytest.approx(bubbled.bubble_us)


def test_a_single_launch_kernel_pays_its_hand_off() -> None:
    s = model.SassStats(96, 0, 900, 128, 375, 1, 150)
    k = model.Kernel("one", "one", 80, 256, 7_680_000, (3, 4, 5, 6))
    plain = model.project_node(k, s, 0.6, 3.0)
    fused = model.project_node(replace(k, handoffs=1), s, 0.6, 3.0)
    assert plain.ctas_per_sm == 1 and plain.limiter == "bandwidth"
    handoff = 2 * 193 / 1380 + 0.5
    assert fused.total_us - plain.total_us == pytest.approx(handoff)


def test_floor_is_the_bytes_at_the_ceiling_plus_one_latency_and_one_gap() -> None:
    floor = model.floor_node(8_500_000, latency_us=0.5, launch_gap_us=2.0)
    assert floor.total_us == pytest.approx(2.0 + 0.5 + 10.0)


def test_launch_gap_fit_shares_one_cost_per_node() -> None:
    assert model.fit_launch_gap([10.0, 12.0], [18.0, 22.0], nodes=2) == pytest.approx(4.5)


def test_floor_device_code_compiles_for_sm70_without_spills(tmp_path) -> None:
    from tools import sm70_gate

    variants = [(n, hint) for n in (2, 16) for hint in (0, 1)]
    exprs = [f"qpnserve_floor::read_floor_m1_kernel<{n}, {hint}>" for n, hint in variants]
    exprs.append("qpnserve_floor::derive_input_m1_kernel")
    source = ROOT / "csrc" / "bench_floor.cu"
    ptx, lowered = sm70_gate.nvrtc_compile(source.read_bytes(), source.name, exprs, "70", [])
    assert "ld.global.cs.v4.u32" in ptx
    _, log = builds.ptxas(ptx, tmp_path, "floor")
    reports = {m: sm70_gate.KernelReport(e, m, True) for e, m in lowered.items()}
    sm70_gate.parse_ptxas(log, reports)
    for report in reports.values():
        assert report.registers > 0 and report.clean and report.stack_bytes == 0, report


@pytest.mark.slow
def test_host_wheel_kernels_are_the_calibration_kernels(tmp_path) -> None:
    """Fetches the ReVolta 0.1.4 and triton 3.3.1 wheels (cached per user) and reads the SASS."""
    if os.environ.get("QPNSERVE_NO_NETWORK") == "1":
        pytest.skip("QPNSERVE_NO_NETWORK=1: the wheels cannot be fetched")
    kernels = tables.host_kernels(tables.HOST_BUILDS["4byte"])
    found = builds.host_binaries([k.symbol for k in kernels], tmp_path)
    w13 = found[kernels[0].symbol]
    kinds = sass.count_kinds(w13.instrs)
    assert (len(w13.instrs), kinds["hmma"], w13.registers) == (600, 80, 56)
    stats = builds.stats(w13, kernels[0])
    assert stats.dram_bytes_in_flight == 12  # two weight words and one metadata record
    assert stats.bubbles == 0  # one kernel streams one tensor pair: no phase change inside
    assert len(w13.controls) == len(w13.instrs)


def test_measured_window_cycles_replace_the_chain_estimate() -> None:
    k = model.Kernel("one", "one", 80, 320, 7_296_000, (3, 4, 5, 6), handoffs=1)
    base = model.SassStats(140, 0, 2300, 300, 300, 1, 180, tail_bytes_per_cta=30_400,
                           handoff_in_overlap=True, epilogue_overlap_instructions=400)  # fmt: skip
    estimated = model.project_node(k, base, 0.6, 3.0)  # 400 x 4 cycles + hand-off: hidden
    measured = model.project_node(k, base, 0.6, 3.0, window_cycles=3500)
    # 3,500 cycles at 1380 MHz + the hand-off (2 L2 trips + 0.5 us) against 30,400 B at 850/80.
    exposed = 3500 / 1380 + 2 * 193 / 1380 + 0.5 - 30_400 / (850e3 / 80)
    assert measured.epilogue_us - estimated.epilogue_us == pytest.approx(exposed)


def test_a_trace_gives_the_strip_cycles_of_its_format() -> None:
    from tools.sm70proj import cli

    doc = {
        "kind": "qpnserve.op_trace",
        "format": "3byte",
        "findings": {"strip_after_w2_issue_cycles": 1952.0, "arrive_cost_cycles": 921.75},
    }
    # The arrival's cycles wait on L2 (fence + atomic): they do not transfer by clock.
    assert cli.trace_window_cycles(doc) == ("3byte", 1952.0)
    with pytest.raises(ValueError, match="not a bench op --trace file"):
        cli.trace_window_cycles({"kind": "qpnserve.op_bench"})
    no_strip = {**doc, "findings": {"strip_after_w2_issue_cycles": None}}
    with pytest.raises(ValueError, match="no strip cycles"):
        cli.trace_window_cycles(no_strip)


# W2 of the V100 design in miniature: 8 code loads from w2 (parameter 5, c[0x0][0x188]) and 2
# metadata loads from s2 (parameter 6), 16 B each: 160 B per thread as listed.
W2_TAIL = [
    "IMAD.WIDE R2, R0, R3, c[0x0][0x188]",
    *[f"LDG.E.EF.128.SYS R{4 + 4 * n}, [R2+{n * 0x200:#x}]" for n in range(8)],
    "IMAD.WIDE R40, R0, R3, c[0x0][0x190]",
    "LDG.E.EF.128.SYS R44, [R40]",
    "LDG.E.EF.128.SYS R48, [R40+0x200]",
    "EXIT",
]


def test_the_tail_counts_w2s_real_bytes_per_cta_not_lane_widths_times_threads() -> None:
    # 4-byte W2 per call: ten routes x (204,800 B codes + 51,200 B metadata), read by 80 CTAs of
    # 320 threads. m8n8k4 lanes load the same metadata, so 160 B x 320 threads (51,200 B) is
    # not what a CTA reads: 2,560,000 / 80 = 32,000 B is.
    k = model.Kernel("w2", "w2", 80, 320, 2_560_000, (5, 6),
                     param_bytes=((5, 2_048_000), (6, 512_000)))  # fmt: skip
    b = builds.Binary("w2", W2_TAIL, 126, 0, 0, 320, [])
    loads = tuple(i for i, x in enumerate(W2_TAIL) if x.startswith("LDG"))
    assert sass.listed_bytes(W2_TAIL, {5, 6}) == 160
    assert builds.real_bytes_per_cta(b, k, loads) == pytest.approx(32_000)
    # The codes' loads alone release the codes' share only: 2,048,000 / 80 B.
    assert builds.real_bytes_per_cta(b, k, loads[:8]) == pytest.approx(25_600)


def test_a_traces_strip_cycles_enter_the_projection_of_their_format_only() -> None:
    from tools.sm70proj import cli

    k = model.Kernel("one", "one", 80, 320, 7_296_000, (3, 4, 5, 6), handoffs=1)
    s = model.SassStats(140, 0, 2300, 300, 300, 1, 180, tail_bytes_per_cta=30_400,
                        handoff_in_overlap=True, epilogue_overlap_instructions=400)  # fmt: skip
    loaded = {"op-3byte": [(k, s)], "op-4byte": [(k, s)]}
    plain = cli.project(loaded, cli.Assumptions(), 3.0)
    traced = cli.project(loaded, cli.Assumptions(window_cycles=(("3byte", 3500.0),)), 3.0)
    # 3,500 cycles at 1380 MHz + the hand-off (2 L2 trips of 193 cycles + 0.5 us) outlast
    # 30,400 B at 850/80 GB/s by 0.455 us; the SASS estimate (400 x 4 cycles) hid inside.
    moved = float(traced["op-3byte"]["us"]) - float(plain["op-3byte"]["us"])  # type: ignore[arg-type]
    assert moved == pytest.approx(3500 / 1380 + 2 * 193 / 1380 + 0.5 - 30_400 / 10_625)
    assert moved == pytest.approx(0.4547, abs=1e-4)
    assert traced["op-4byte"]["us"] == plain["op-4byte"]["us"]
