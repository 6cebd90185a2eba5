"""tools/sm70proj/scoreboard.py: Volta control bits on literal instruction words, and where a warp
stops for a load (the first wait on its barrier) on small literal listings.

Every high word below is copied from cuobjdump 12.8's listing of the V100 design's sm_70 build;
the expected fields are decoded by hand from the bit positions of Jia et al. 2018 (stall 41-44,
yield 45, write barrier 46-48, read barrier 49-51, wait mask 52-57; 7 = no barrier).
"""

from __future__ import annotations

from tools.sm70proj import sass, scoreboard
from tools.sm70proj.scoreboard import Control


def test_decodes_a_load_that_sets_barrier_4() -> None:
    # LDG.E.EF.128.SYS R20, [R20]: the strip's first load.
    assert scoreboard.decode_control(0x000F2200000EED00) == Control(1, True, 4, None, 0)


def test_decodes_a_load_with_a_read_barrier() -> None:
    # LDG.E.EF.128.SYS R36, [R2+0xa000]: the last W2 load (its address registers on SB0).
    assert scoreboard.decode_control(0x00012400000EED00) == Control(2, True, 4, 0, 0)


def test_decodes_a_wait_mask_of_two_barriers() -> None:
    # SHF.R.U32.HI R3, RZ, 0x8, R20: waits on SB0 and SB4.
    c = scoreboard.decode_control(0x011FE20000011614)
    assert c == Control(1, True, None, None, 0b010001)
    assert c.waits_on(4) and c.waits_on(0) and not c.waits_on(2)


def test_reuse_bits_above_the_wait_mask_are_not_waits() -> None:
    # LOP3.LUT R4, R8.reuse, ...: bits 58-63 carry operand reuse; the wait mask is SB2 alone.
    c = scoreboard.decode_control(0x144FE200078EEA03)
    assert c.wait_mask == 0b000100 and c.stall_cycles == 1


def test_decodes_a_compare_waiting_on_barrier_2() -> None:
    # ISETP.GE.AND P1, PT, R11, c[0x0][0x1b0], PT: waits for the id load on SB2.
    assert scoreboard.decode_control(0x004FC80003F26270) == Control(4, False, None, None, 0b100)


# A strip load and a W2 load share SB4; the first instruction that waits on SB4 reads only the
# strip's register (R20), yet the warp stops there until the W2 load has landed too. A rule by
# register dataflow would put the first use of W2's R36 at the HADD2 instead.
LISTING = """
        Function : _Z4testv
        /*0000*/                   LDG.E.EF.128.SYS R20, [R20] ;            /* 0x0000000014147381 */
                                                                            /* 0x000f2200000eed00 */
        /*0010*/                   LDG.E.SYS R11, [R6] ;                    /* 0x00000000060b7381 */
                                                                            /* 0x000ea200001ee900 */
        /*0020*/ ISETP.GE.AND P1, PT, R11, c[0x0][0x1b0], PT ; /* 0x00006c000b007a0c */
                                                                            /* 0x004fc80003f26270 */
        /*0030*/                   LDG.E.EF.128.SYS R36, [R2+0xa000] ;      /* 0x00a0000002247381 */
                                                                            /* 0x00012400000eed00 */
        /*0040*/                   LOP3.LUT R6, R0, 0x1f, RZ, 0xc0, !PT ;   /* 0x0000001f00067812 */
                                                                            /* 0x000fc600078ec0ff */
        /*0050*/                   SHF.R.U32.HI R3, RZ, 0x8, R20 ;          /* 0x00000008ff037819 */
                                                                            /* 0x011fe20000011614 */
        /*0060*/                   HADD2 R5, R36, R37 ;                     /* 0x0000002524057230 */
                                                                            /* 0x000fc60000000000 */
        /*0070*/                   EXIT ;                                   /* 0x000000000000794d */
                                                                            /* 0x000fea0003800000 */
"""


def _listing() -> tuple[list[str], list[Control]]:
    instrs = sass.parse_listing(LISTING)["_Z4testv"]
    controls = scoreboard.parse_controls(LISTING)["_Z4testv"]
    assert len(instrs) == len(controls) == 8
    return instrs, controls


def test_controls_parse_index_for_index_with_the_listing() -> None:
    instrs, controls = _listing()
    assert instrs[3] == "LDG.E.EF.128.SYS R36, [R2+0xa000]"
    assert controls[3].write_barrier == 4 and controls[5].wait_mask == 0b010001


def test_the_first_wait_on_a_loads_barrier_is_where_the_warp_stops() -> None:
    _, controls = _listing()
    assert scoreboard.first_wait(controls, after=3, barrier=4) == 5
    assert scoreboard.first_wait(controls, after=1, barrier=2) == 2
    assert scoreboard.first_wait(controls, after=5, barrier=4) == 8  # none after: the end


def test_every_load_sharing_the_barrier_must_land_at_that_wait() -> None:
    instrs, controls = _listing()
    dram = [True, False, False, True, False, False, False, False]
    t = scoreboard.tail(instrs, controls, dram)
    assert t == scoreboard.Tail(last_load=3, wait_at=5, exit_at=7, loads_waited=(0, 3))


# W13's last load on SB2, drained by the compare; the id reload on SB3 is one L2 round trip
# (the STS waits on it); then the next tensor's first load. Parameters are given per instruction.
PHASES = """
        Function : _Z6phasesv
        /*0000*/                   LDG.E.SYS R11, [R6] ;                    /* 0x00000000060b7381 */
                                                                            /* 0x000ea200001ee900 */
        /*0010*/ ISETP.GE.AND P1, PT, R11, c[0x0][0x1b0], PT ; /* 0x00006c000b007a0c */
                                                                            /* 0x004fc80003f26270 */
        /*0020*/                   LDG.E.SYS R8, [R8] ;                     /* 0x0000000008087381 */
                                                                            /* 0x000ee200001ee900 */
        /*0030*/              @!P2 STS [R37+0x4120], R8 ;                   /* 0x004120082500a388 */
                                                                            /* 0x0081ee0000000800 */
        /*0040*/                   LOP3.LUT R6, R0, 0x1f, RZ, 0xc0, !PT ;   /* 0x0000001f00067812 */
                                                                            /* 0x000fc600078ec0ff */
        /*0050*/                   LDG.E.EF.128.SYS R36, [R2+0xa000] ;      /* 0x00a0000002247381 */
                                                                            /* 0x00012400000eed00 */
        /*0060*/                   EXIT ;                                   /* 0x000000000000794d */
                                                                            /* 0x000fea0003800000 */
"""


def _phases() -> tuple[list[str], list[Control]]:
    return sass.parse_listing(PHASES)["_Z6phasesv"], scoreboard.parse_controls(PHASES)["_Z6phasesv"]


def test_a_drained_stream_moving_to_another_tensor_is_a_bubble() -> None:
    instrs, controls = _phases()
    dram = [True, False, False, False, False, True, False]
    params = [3, None, 7, None, None, 5, None]
    found = scoreboard.bubbles(instrs, controls, dram, params)
    # The compare, the id load, the STS and the LOP3 run between the drain and W2's first load.
    assert found == [scoreboard.Bubble(drained_at=1, next_load=5, instructions=4, l2_trips=1)]


def test_a_drained_stream_going_on_with_the_same_tensor_is_no_bubble() -> None:
    # A loop's next round of the same tensors: the stream's latency rounds already count it.
    instrs, controls = _phases()
    dram = [True, False, False, False, False, True, False]
    params = [3, None, 7, None, None, 3, None]
    assert scoreboard.bubbles(instrs, controls, dram, params) == []


def test_the_bubble_takes_the_path_of_the_first_warps_through_forward_branches() -> None:
    # One warp's SwiGLU sits under "@P1 BRA": the other warps jump to the next load at once.
    instrs = [
        "BAR.SYNC 0x0",
        "@P1 BRA 0x50",  # 0x50 / 16 = instruction 5
        "MUFU.EX2 R3, R2",
        "FADD R4, R3, 1",
        "STG.E.SYS [R6], R4",
        "LDG.E.EF.128.SYS R36, [R2]",
    ]
    assert scoreboard.shortest_path(instrs, 0, 5) == [0, 1, 5]
    # A branch with its predicate as an operand may fall through too; an unconditional one not.
    assert scoreboard.shortest_path([*instrs[:1], "BRA !P3, 0x50", *instrs[2:]], 0, 5) == [0, 1, 5]
    assert scoreboard.shortest_path([*instrs[:1], "BRA 0x30", *instrs[2:]], 0, 5) == [0, 1, 3, 4, 5]


# After the strip fix (1162b12): the W2 loads' barrier SB4 is named first by a CALL that
# BRA.CONV jumps over when the warp is converged (__syncwarp's slow path), then by the grid
# barrier's poll, which needs the ATOM's result: the ATOM shares SB4 with the W2 loads.
BARRIER = """
        Function : _Z7barrierv
        /*0000*/                   LDG.E.EF.128.SYS R36, [R2+0xa000] ;      /* 0x00a0000002247381 */
                                                                            /* 0x00012400000eed00 */
        /*0010*/                   BRA.CONV 0x30 ;                          /* 0x0000003300007947 */
                                                                            /* 0x000fea0003800000 */
        /*0020*/                   CALL.REL.NOINC 0x9060 ;                  /* 0x0000350000007944 */
                                                                            /* 0x030fea0003c00000 */
        /*0030*/                   ATOM.E.ADD.STRONG.GPU PT, R13, [R2+0x4], R13 ; /* 0x0000040d0 */
                                                                            /* 0x00012800001f41ff */
        /*0040*/                   LD.E.STRONG.GPU R12, [R2+0x4] ;          /* 0x00000004020c7980 */
                                                                            /* 0x000ea40000114900 */
        /*0050*/                   LOP3.LUT R14, R12, R13, RZ, 0x3c, !PT ;  /* 0x0000000d0c0e7212 */
                                                                            /* 0x014fe200078e3cff */
        /*0060*/                   EXIT ;                                   /* 0x000000000000794d */
                                                                            /* 0x000fea0003800000 */
"""


def test_a_slow_path_call_branched_over_is_not_where_the_warp_stops() -> None:
    instrs = sass.parse_listing(BARRIER)["_Z7barrierv"]
    controls = scoreboard.parse_controls(BARRIER)["_Z7barrierv"]
    assert controls[2].wait_mask == 0b110000 and controls[3].write_barrier == 4
    assert scoreboard.slow_path_calls(instrs) == {2}
    t = scoreboard.tail(instrs, controls, [True, False, False, False, False, False, False])
    # The poll's compare (SB2 for the LD, SB4 for the ATOM's result and the W2 load).
    assert t == scoreboard.Tail(last_load=0, wait_at=5, exit_at=6, loads_waited=(0,))


def test_an_unconditional_call_is_not_a_slow_path() -> None:
    instrs = ["IADD3 R1, R1, 0x1, RZ", "CALL.REL.NOINC 0x9060", "EXIT"]
    assert scoreboard.slow_path_calls(instrs) == frozenset()


def test_a_printf_before_a_trap_is_off_the_common_path() -> None:
    # The grid barrier's null-workspace check (70163d4): "@P0 BRA" past vprintf and BPT.TRAP.
    instrs = [
        "@P0 BRA 0x70",  # 0x70 / 16 = instruction 7, past the trap
        "MOV R0, 0x0",
        "LDC.64 R8, c[0x4][R0]",
        "LEPC R10",
        "MOV R3, 0x6250",
        "CALL.ABS.NOINC R8",
        "BPT.TRAP 0x1",
        "S2R R3, SR_CTAID.X",
    ]
    assert scoreboard.slow_path_calls(instrs) == {5}
    # The nearest branch before the CALL decides: one landing before it does not skip it.
    assert scoreboard.slow_path_calls(["@P0 BRA 0x20", *instrs[1:]]) == frozenset()


def test_an_unconditional_branch_before_a_call_is_not_a_slow_path_skip() -> None:
    # "BRA" with no predicate always jumps past the CALL (0x40 / 16 = instruction 4): the CALL
    # is reached only from elsewhere, and there it waits on every barrier. Only a conditional
    # branch (@P, BRA.CONV, BRA.DIV) makes the CALL a path the common case does not take.
    instrs = ["IADD3 R1, R1, 0x1, RZ", "BRA 0x40", "MOV R3, 0x0", "CALL.REL.NOINC 0x9060", "EXIT"]
    assert scoreboard.slow_path_calls(instrs) == frozenset()
    assert scoreboard.slow_path_calls([instrs[0], "@P0 BRA 0x40", *instrs[2:]]) == {3}


def test_a_slow_path_calls_wait_is_not_the_drain_before_a_bubble() -> None:
    # The rule of tail(): a CALL that a conditional branch jumps over waits on every barrier but
    # is not issued on the common path; the W13 load drains at the FADD that reads it.
    instrs = [
        "LDG.E.EF.128.SYS R4, [R2]",
        "@P0 BRA 0x30",  # 0x30 / 16 = instruction 3, past the CALL
        "CALL.REL.NOINC 0x9060",
        "FADD R5, R4, R4",
        "LDG.E.EF.128.SYS R8, [R6]",
        "EXIT",
    ]
    none = Control(1, False, None, None, 0)
    controls = [
        Control(1, False, 2, None, 0),  # W13's load sets SB2
        none,
        Control(5, False, None, None, 0b111111),  # the CALL waits on every barrier
        Control(4, False, None, None, 0b000100),  # the FADD waits on SB2
        Control(1, False, 3, None, 0),  # W2's first load
        none,
    ]
    found = scoreboard.bubbles(instrs, controls, [True, False, False, False, True, False],
                               [3, None, None, None, 5, None])  # fmt: skip
    assert found == [scoreboard.Bubble(drained_at=3, next_load=4, instructions=1, l2_trips=0)]
