"""The V100 timing model (pure arithmetic; every constant is named with its source).

One graph node (kernel) on a V100, as a one-wave kernel whose warps all start together:

    node = launch gap                       graph kernel node to kernel node, no PDL on sm_70
         + prologue                         dependent L2 round trips before the first DRAM load
         + stream                           the DRAM bytes: max(one latency to fill the pipe +
                                            bytes at the read ceiling, rounds x latency) where
                                            rounds = DRAM bytes per thread / DRAM bytes a thread
                                            keeps in flight (closed loop: a warp issues its next
                                            loads only when the ones it waits on are back)
         + bubble                           per phase change (the DRAM loads move to other
                                            tensors only after every earlier DRAM load was
                                            waited on): the work in between as one chain, its
                                            L2 round trips, and one DRAM latency to refill
         + issue excess                     instruction issue beyond what the stream hides
         + epilogue                         from the first instruction that WAITS on the last
                                            DRAM load's scoreboard barrier (its wait mask; the
                                            warp stops there until every load on that barrier
                                            has landed) to EXIT, one dependent chain on one warp;
                                            the work between that load and that wait (and a
                                            grid hand-off placed there) runs while those loads'
                                            real bytes arrive at the SM's share of the ceiling,
                                            and counts only where it is longer

A single-launch design pays one launch gap and one prologue, and a grid-wide hand-off (one
store and one poll through L2, plus the spread between the first and the last CTA).
The assumed constants (DRAM latency, hand-off spread, cycles per chained instruction) are
arguments, so the CLI can give the projection as a range over their plausible bounds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# --- V100-PCIe facts and assumptions ---------------------------------------------------------
SMS = 80
READ_GB_S = 850.0  # measured read ceiling of a V100-PCIe (notes 1.2; contract section 6)
L2_BYTES = 6 * 1024 * 1024
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
SMEM_PER_SM = 96 * 1024
ISSUE_PER_SM_CLK = 4  # four schedulers, one warp instruction each per clock
CLOCK_MHZ = 1380.0  # V100-PCIe boost clock [assumed]
DRAM_LATENCY_US = 0.6  # loaded DRAM latency [assumed, notes 2.x Little's-law estimates]
L2_LATENCY_CLK = 193  # L2 hit latency on GV100 (Jia et al. 2018, "Dissecting Volta", sec. 3.2)
DEPENDENT_ISSUE_CLK = 4  # Volta ALU dependent-issue latency, cycles (Jia et al. 2018, ch. 4)
HANDOFF_L2_TRIPS = 2  # a grid-wide hand-off: h (or a tag) stored to L2, then polled back
HANDOFF_SPREAD_US = 0.5  # first to last CTA reaching the hand-off [assumed]
# Graph kernel node -> kernel node on a V100 (no PDL): not published for this probe. Published
# V100 bounds: ~5.2 us per graph iteration of a small kernel, gap and kernel together (gunrock
# issue 438, GV100, CUDA 10.0); ~3 us per null-kernel launch (NVIDIA developer forum). The
# projection fits it to the host's two measurements (fit_launch_gap) unless told a value.
LAUNCH_GAP_BOUNDS_US = (0.5, 5.2)
LAUNCH_GAP_US = 0.0  # the default before the fit: kernel bodies only


@dataclass(frozen=True)
class Kernel:
    """One launch: what the binary does not say (grid, bytes) comes from this table."""

    label: str
    symbol: str  # name expression (ours, NVRTC) or mangled-name fragment (host)
    ctas: int
    threads: int  # 0: read from the kernel's __launch_bounds__
    dram_bytes: int  # bytes this kernel's threads load from DRAM per call
    dram_params: tuple[int, ...]  # kernel parameters (pointer slots) whose loads go to DRAM
    prefetch_bytes: int = 0  # DRAM bytes it moves into L2 without holding registers
    handoffs: int = 0  # grid-wide hand-offs inside the kernel (a single-launch design: 1)
    # (parameter, DRAM bytes per call) of each DRAM stream: what the CTA really reads, which the
    # loads' widths overstate where lanes load the same address (the m8n8k4 fragment layout).
    param_bytes: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class SassStats:
    """What the model reads from a kernel's SASS and resource report."""

    registers: int
    smem_bytes: int
    instructions: int
    dram_bytes_in_flight: int  # per thread, loads from the DRAM parameters only
    dram_bytes_listed: int  # per thread, summed over the DRAM loads of the listing (loops once)
    prologue_l2_trips: int  # dependent L2 loads before the first DRAM load
    epilogue_instructions: int  # from the first wait on the last DRAM load's barrier to EXIT
    epilogue_overlap_instructions: int = 0  # between the last DRAM load and that wait
    tail_bytes_per_cta: float = 0.0  # real DRAM bytes of the loads that wait releases, per CTA
    handoff_in_overlap: bool = False  # the grid hand-off's atomic lies before that wait
    bubble_instructions: int = 0  # from each drain to the next phase's first DRAM load
    bubble_l2_trips: int = 0  # dependent non-DRAM round trips inside the bubbles
    bubbles: int = 0  # phase changes with the SM's DRAM stream drained


@dataclass
class NodeTerms:
    label: str
    ctas_per_sm: int
    rounds: float
    launch_gap_us: float
    prologue_us: float
    stream_us: float
    issue_excess_us: float
    epilogue_us: float
    limiter: str
    bubble_us: float = 0.0
    total_us: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def occupancy(registers: int, threads: int, smem: int) -> tuple[int, int]:
    """(blocks per SM, resident warps per SM) on a V100 (registers allocated per warp in 256s)."""
    warps_per_block = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = (REGS_PER_SM // regs_per_warp) // warps_per_block
    by_warps = MAX_WARPS_PER_SM // warps_per_block
    by_smem = SMEM_PER_SM // smem if smem else MAX_BLOCKS_PER_SM
    blocks = max(0, min(by_regs, by_warps, by_smem, MAX_BLOCKS_PER_SM))
    return blocks, blocks * warps_per_block


def us(cycles: float, clock_mhz: float = CLOCK_MHZ) -> float:
    return cycles / clock_mhz


def project_node(
    k: Kernel,
    s: SassStats,
    latency_us: float = DRAM_LATENCY_US,
    launch_gap_us: float = LAUNCH_GAP_US,
    clock_mhz: float = CLOCK_MHZ,
    *,
    spread_us: float = HANDOFF_SPREAD_US,
    chain_clk: float = DEPENDENT_ISSUE_CLK,
    window_cycles: float | None = None,
) -> NodeTerms:
    """window_cycles: the SM cycles the work between the last DRAM load and the first wait on
    its barrier was MEASURED to take (a trace's strip), instead of its chain estimate from the
    SASS; a grid hand-off there keeps its own term."""
    limit, _ = occupancy(s.registers, k.threads, s.smem_bytes)
    if limit == 0:
        raise ValueError(f"{k.label}: a CTA does not fit on a V100 SM")
    # CTAs run in waves of (CTAs per SM x SMs); each wave streams its share of the bytes.
    per_wave = limit * SMS
    waves = math.ceil(k.ctas / per_wave)
    per_sm = min(limit, math.ceil(k.ctas / SMS))
    warps = math.ceil(k.threads / 32)
    per_thread = k.dram_bytes / (k.ctas * k.threads)
    rounds = per_thread / max(s.dram_bytes_in_flight, 1)
    stream = 0.0
    bandwidth_bound = True
    for w in range(waves):
        share = min(per_wave, k.ctas - w * per_wave) / k.ctas
        at_ceiling = share * (k.dram_bytes + k.prefetch_bytes) / (READ_GB_S * 1e3)
        stream += max(latency_us + at_ceiling, rounds * latency_us)
        bandwidth_bound = bandwidth_bound and latency_us + at_ceiling >= rounds * latency_us
    # The busiest SM issues every instruction of its CTAs; the stream hides what fits in it.
    # A loop is listed once: scale the listing by how often its DRAM loads must run.
    repeats = max(1.0, per_thread / max(s.dram_bytes_listed, 1))
    executed = s.instructions * repeats
    issue = us(executed * warps * per_sm * waves / ISSUE_PER_SM_CLK, clock_mhz)
    issue_excess = max(0.0, issue - stream)
    prologue = us(s.prologue_l2_trips * L2_LATENCY_CLK, clock_mhz)
    epilogue = us(s.epilogue_instructions * chain_clk, clock_mhz)
    # The work between the last DRAM load and the first wait on its barrier runs while the loads
    # that wait releases arrive: their real bytes for the SM's CTAs at the SM's share.
    tail_us = s.tail_bytes_per_cta * per_sm / (READ_GB_S * 1e3 / SMS)
    handoff = k.handoffs * (us(HANDOFF_L2_TRIPS * L2_LATENCY_CLK, clock_mhz) + spread_us)
    window = us(s.epilogue_overlap_instructions * chain_clk, clock_mhz)
    if window_cycles is not None:
        window = us(window_cycles, clock_mhz)
    if s.handoff_in_overlap:
        # Arrival and polling run in the window; the poll that sees the flip reads L2 once more
        # after the wait (its first read was issued before the bytes landed).
        window += handoff
        epilogue += k.handoffs * us(L2_LATENCY_CLK, clock_mhz)
    else:
        epilogue += handoff
    epilogue += max(0.0, window - tail_us)
    bubble = us(
        s.bubble_instructions * chain_clk + s.bubble_l2_trips * L2_LATENCY_CLK,
        clock_mhz,
    )
    bubble += s.bubbles * latency_us
    limiter = "bandwidth" if bandwidth_bound else "latency rounds"
    if waves > 1:
        limiter += f", {waves} waves"
    if issue_excess > 0:
        limiter = "issue"
    terms = NodeTerms(
        k.label, per_sm, rounds, launch_gap_us, prologue, stream, issue_excess, epilogue, limiter,
        bubble,
    )  # fmt: skip
    terms.total_us = launch_gap_us + prologue + stream + bubble + issue_excess + epilogue
    return terms


def floor_node(
    dram_bytes: int, latency_us: float = DRAM_LATENCY_US, launch_gap_us: float = LAUNCH_GAP_US
) -> NodeTerms:
    """A pure read of the same bytes in one node with enough loads in flight: gap + fill + bytes."""
    at_ceiling = dram_bytes / (READ_GB_S * 1e3)
    terms = NodeTerms("read floor", 0, 1.0, launch_gap_us, 0.0, latency_us + at_ceiling, 0, 0, "bw")
    terms.total_us = launch_gap_us + terms.stream_us
    return terms


def fit_launch_gap(bodies_us: list[float], measured_us: list[float], nodes: int) -> float:
    """Least-squares per-node cost g: measured_i = body_i + nodes * g over the given probes."""
    residual = [m - b for b, m in zip(bodies_us, measured_us, strict=True)]
    return sum(residual) / (nodes * len(residual))
