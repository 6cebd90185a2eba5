// The V100 design of the AWQ M1 operator, its one CUDA form on every GPU: one cooperative launch
// per layer, 80 CTAs of 10 warps, all co-resident (one per SM on a V100's 80 SMs), each reading
// the same number of bytes. Newer GPUs run the same code (m8n8k4 is emulated there): correct,
// but its time there is not a V100 speed.
//
// Why this shape (V100: ~850 GB/s read ceiling, 80 SMs, 6 MB L2, mma.m8n8k4 only, no PDL, no
// clusters): 7.68 MB per layer is ~9 us at the ceiling, so a second kernel's launch and drain
// (~2-3 us without PDL) or 20 SMs doing twice the work (100 W13 units on 80 SMs) cost more than
// the arithmetic. Per CTA c (of 80), every byte read once and in this order:
//   1. W13 strip: a quarter of the columns (8 = 4 gate/up pairs) of one of the 20 units that do
//      not get a CTA of their own (routes 8 and 9), all 2560 k; loads issued first.
//   2. W13 unit (tile c % 10, route c / 10): unit A (w13_swiglu_unit, m8n8k4), h to
//      intermediate.
//   3. W2 of output tile c, all routes: issued right after the W13 unit and after the strip's
//      registers are settled (Strip::settle), so its 2.56 MB streams while the strip finishes
//      and h is exchanged, and nothing before the grid barrier waits on W2's bytes.
//   4. The strip's h (SIMT FP32 FMAs on the HFMA2-dequantized weights, a fixed reduction order),
//      then the grid barrier: every h of the layer is in intermediate (L2) after it.
//   5. w2_tile_unit on tile c: y_route, then the route combine into out.
// Bytes per CTA (4-byte metadata): strip 12,800 + unit 51,200 + W2 32,000 = 96,000 (3-byte:
// 91,200): 1/80 of the layer each.
// The strip is cut by columns, not by K, so no FP32 partial crosses CTAs: the only state shared
// between CTAs is intermediate (the caller's buffer) and the barrier, whose workspace the driver
// gives each cooperative launch. Two calls in flight at once (two streams, two graphs) share
// nothing; a grid that cannot be co-resident fails at launch with an error, never hangs, and a
// barrier that is never completed traps (grid_barrier_wait) instead of hanging a rank.
// Deterministic: every sum in a fixed order, no atomic operation on a value.
//
// QPN_TRACE (defined only by the bench extension's traced copy, csrc/bench_trace.cu): thread 0
// of every CTA stores %globaltimer and %clock64 at the points of TraceStamp. Undefined (the
// shipped build) every QPN_TRACE_STAMP is empty; tests/kernels/test_sm70_trace_macro.py shows
// the SASS is then the same as without the macros.

#pragma once

#include "awq_moe_m1_common.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// The per-CTA trace of the traced build: (CTAs, kTraceStamps, 2) uint64, (%globaltimer ns,
// %clock64 cycles of the CTA's SM) at each point.
enum TraceStamp : int {
  kTraceStart = 0,       // the CTA begins
  kTraceW2Issued = 1,    // warp 0 has issued its W2 loads
  kTraceStripDone = 2,   // the strip's h is stored (warp 0)
  kTraceArrived = 3,     // thread 0's arrival at the grid barrier is done
  kTraceExited = 4,      // the CTA is past the grid barrier
  kTraceEnd = 5,         // the CTA's output tile is stored
  kTraceStamps = 6,
};
#ifdef QPN_TRACE
__device__ __forceinline__ void trace_stamp(const MoeArgs& a, int point) {
  if (threadIdx.x == 0) {
    unsigned long long ns, cycles;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(cycles));
    unsigned long long* at = a.trace + (blockIdx.x * kTraceStamps + point) * 2;
    at[0] = ns;
    at[1] = cycles;
  }
}
#define QPN_TRACE_STAMP(args, point) ::qpn::trace_stamp(args, point)
#else
#define QPN_TRACE_STAMP(args, point)
#endif

// ---------------------------------------------------------------------------------------------
// The grid barrier of a cooperative launch, on the workspace the driver gives each such launch
// (the ABI that cooperative_groups' grid sync reads: its address in %envreg1 (high half) and
// %envreg2 (low half), the barrier word 4 bytes in). Written here rather than included because
// cooperative_groups.h needs libcu++ headers that the NVRTC of the sm_70 gate does not ship, and
// because its sync neither checks the workspace nor bounds its wait.
// Thread 0 of every CTA adds 1, CTA 0's adds 2^31 - (CTAs - 1) instead: from the zeroed
// workspace the word's top bit flips exactly when the last CTA arrives, and its low 31 bits are
// zero again after each barrier, so a later barrier needs no reset.
//
// A broken launch must error, not hang a rank (and with it the server's other ranks): a null
// workspace (a launch that was not cooperative) traps at once, and the wait traps after
// kMaxBarrierPolls polls. One poll is an acquire load from L2 plus the loop, ~200 SM cycles
// (V100 L2 hit latency 193 cycles, Jia et al. 2018), ~0.15 us at 1.38 GHz, so 2^26 polls is
// ~10 s on a V100, about a million times the barrier's normal wait. A count, not a clock: a
// timer read would delay every poll. The trap poisons the process's CUDA context; the message
// (device printf, shown when the host next synchronises) names the op and the way back.
constexpr unsigned kMaxBarrierPolls = 1u << 26;

__device__ __forceinline__ unsigned* launch_barrier_word() {
  unsigned hi, lo;
  asm volatile("mov.u32 %0, %%envreg1;" : "=r"(hi));
  asm volatile("mov.u32 %0, %%envreg2;" : "=r"(lo));
  if ((hi | lo) == 0u) {
    printf("qpnserve awq_moe_m1_out: the grid barrier has no cooperative-launch workspace (the "
           "kernel was not launched cooperatively); the CUDA context is lost: restart without "
           "the route (qpnserve rollback --restart)\n");
    __trap();
  }
  return reinterpret_cast<unsigned*>(((static_cast<unsigned long long>(hi) << 32) | lo) + 4);
}

// Thread 0's arrival (the CTA's stores before it: __syncthreads, then a release): the word and
// what it held before, for grid_barrier_wait. Other threads get nothing.
struct BarrierTicket {
  const unsigned* word;
  unsigned seen;
};
__device__ __forceinline__ BarrierTicket grid_barrier_arrive() {
  __syncthreads();  // the CTA's stores before thread 0's release (cumulative)
  BarrierTicket ticket{nullptr, 0u};
  if (threadIdx.x == 0) {
    unsigned* word = launch_barrier_word();
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
    asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;"
                 : "=r"(ticket.seen)
                 : "l"(word), "r"(add)
                 : "memory");
    ticket.word = word;
  }
  return ticket;
}

template <unsigned kMaxPolls = kMaxBarrierPolls>
__device__ __forceinline__ void grid_barrier_wait(const BarrierTicket& ticket) {
  if (threadIdx.x == 0) {
    const unsigned* word = ticket.word;
    const unsigned seen = ticket.seen;
    unsigned now, polls = 0u;
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
      if (++polls == kMaxPolls) {
        printf("qpnserve awq_moe_m1_out: a CTA never reached the grid barrier (timed out); the "
               "CUDA context is lost: restart without the route (qpnserve rollback "
               "--restart)\n");
        __trap();
      }
    } while (((seen ^ now) & 0x80000000u) == 0);
  }
  __syncthreads();  // the acquire of thread 0 orders the CTA's later loads
}

constexpr int kV100Warps = kRoutes;  // unit B takes one warp per route
constexpr int kV100Threads = kV100Warps * 32;
constexpr int kV100Ctas = kTiles2;                        // 80: one W2 output tile each
constexpr int kV100StripUnits = kTiles13 * kRoutes - kV100Ctas;  // 20 units cut into strips
constexpr int kV100Strips = kV100Ctas / kV100StripUnits;  // 4 strips per unit
constexpr int kStripCols = kTile / kV100Strips;           // 8 columns = 4 values of h
constexpr int kRows13 = kHidden / 8;                      // 320 rows of 8 k (one word each)
constexpr int kStripItems = kRows13 * (kStripCols / 4) / kV100Threads;  // (row, 4 columns) each
static_assert(kV100Ctas % kV100StripUnits == 0 && kTile % kV100Strips == 0, "even strips");
static_assert(kStripCols == 8, "a strip is two 16 B column blocks per row");
static_assert(kRows13 * 2 == kStripItems * kV100Threads, "every thread the same strip items");

// One CTA's strip of W13: thread t takes column block t & 1 (4 columns) of the rows
// t / 2 + 160 i, i < kStripItems, and keeps their codes, metadata and x in registers.
template <bool kMeta3>
struct Strip {
  int route, tile, quarter;
  bool valid;
  uint4 codes[kStripItems];  // word j = the 8 codes of row r of column 4 (t & 1) + j
  uint4 meta[kStripItems];   // the 4 columns' records in the row's group
  uint4 xv[kStripItems];     // x[8 r .. 8 r + 7]

  __device__ __forceinline__ Strip(const MoeArgs& a, int cta) {
    const int unit = kV100Ctas + cta / kV100Strips;
    route = unit / kTiles13;
    tile = unit % kTiles13;
    quarter = cta % kV100Strips;
    const int e = a.ids[route];
    valid = route_is_valid(e, a.num_experts);
    if (!valid) {
      // Zeros, so that settle() reads defined registers and finish() adds nothing.
#pragma unroll
      for (int i = 0; i < kStripItems; ++i) {
        codes[i] = make_uint4(0u, 0u, 0u, 0u);
        meta[i] = codes[i];
        xv[i] = codes[i];
      }
      return;
    }
    const int col = tile * kTile + quarter * kStripCols + 4 * (threadIdx.x & 1);
    const unsigned* words = a.w13 + static_cast<long long>(e) * kWords13 + tile * kRows13 * kTile +
                            quarter * kStripCols + 4 * (threadIdx.x & 1);
    const unsigned char* records = static_cast<const unsigned char*>(a.s13) +
                                   static_cast<long long>(e) * kGroups13 * kN13 * (kMeta3 ? 3 : 4);
#pragma unroll
    for (int i = 0; i < kStripItems; ++i) {
      const int r = row(i);
      codes[i] = load_stream(reinterpret_cast<const uint4*>(words + r * kTile));
      const int rec = (r / (kGroup / 8)) * kN13 + col;
      if constexpr (kMeta3) {
        // 12 bytes at a multiple of 12: 4-byte aligned.
        const unsigned* p = reinterpret_cast<const unsigned*>(records + 3 * rec);
        meta[i] = make_uint4(load_stream(p), load_stream(p + 1), load_stream(p + 2), 0u);
      } else {
        meta[i] = load_stream(reinterpret_cast<const uint4*>(records + 4 * rec));
      }
      xv[i] = __ldg(reinterpret_cast<const uint4*>(a.x) + r);
    }
  }

  // Wait for the strip's loads here, before the W2 loads are issued. On sm_70 the compiler may
  // put the strip's loads and W2's on one scoreboard, and a wait on it is a wait for every load
  // it counts: the strip's first use after the W2 issue then stalls until W2's bytes land, and
  // the strip and the grid barrier no longer hide behind W2's flight
  // (tests/kernels/test_sm70_scoreboard.py reads that from the SASS). A store of all the
  // strip's words (folded into one) consumes them; the warp sync keeps the W2 loads after it.
  __device__ __forceinline__ void settle() const {
    __shared__ volatile unsigned sink[kV100Threads];  // volatile: the store stays
    unsigned folded = 0u;
#pragma unroll
    for (int i = 0; i < kStripItems; ++i) {
      folded ^= codes[i].x ^ codes[i].y ^ codes[i].z ^ codes[i].w;
      folded ^= meta[i].x ^ meta[i].y ^ meta[i].z ^ meta[i].w;
      folded ^= xv[i].x ^ xv[i].y ^ xv[i].z ^ xv[i].w;
    }
    sink[threadIdx.x] = folded;
    __syncwarp();
  }

  __device__ __forceinline__ static int row(int i) {
    return static_cast<int>(threadIdx.x >> 1) + i * (kV100Threads / 2);
  }

  // The strip's 4 values of h to intermediate (every thread of the CTA calls it). FP32 sums:
  // per thread its rows in order, then a butterfly over the 16 lanes of one column block, then
  // the 10 warps in order: the same order every run.
  __device__ __forceinline__ void finish(const MoeArgs& a) {
    __shared__ float warp_sums[kV100Warps][kStripCols];
    __shared__ float sums[kTile];  // swiglu_h's layout: gate 2i, up 2i + 1 (first 8 used)
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
#pragma unroll
      for (int i = 0; i < kStripItems; ++i) {
        const float2 x01 = __half22float2(bits_h2(xv[i].x)), x23 = __half22float2(bits_h2(xv[i].y));
        const float2 x45 = __half22float2(bits_h2(xv[i].z)), x67 = __half22float2(bits_h2(xv[i].w));
        const float xs[8] = {x01.x, x01.y, x23.x, x23.y, x45.x, x45.y, x67.x, x67.y};
        const GroupFrag<kMeta3> f{codes[i], meta[i]};
        for_each_column<kMeta3>(f, [&acc, &xs](int c, unsigned word, __half2 s2, __half2 b2) {
          unsigned w[4];
          dequant_word(word, s2, b2, w);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // FP16 x FP16 products are exact in FP32: each FMA is one FP32 addition.
            const float2 wf = __half22float2(bits_h2(w[j]));
            acc[c] = fmaf(wf.x, xs[2 * j], acc[c]);
            acc[c] = fmaf(wf.y, xs[2 * j + 1], acc[c]);
          }
        });
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int m = 2; m < 32; m <<= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], m);
    }
    if (lane < 2) {
#pragma unroll
      for (int c = 0; c < 4; ++c) warp_sums[warp][4 * lane + c] = acc[c];
    }
    __syncthreads();
    if (warp == 0) {
      if (lane < kStripCols) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kV100Warps; ++w) s += warp_sums[w][lane];
        sums[lane] = s;
      }
      __syncwarp();
      const __half h = swiglu_h<1>(sums, lane);
      if (lane < kStripCols / 2) {
        a.intermediate[route * kInter + tile * (kTile / 2) + quarter * (kStripCols / 2) + lane] =
            valid ? h : __float2half_rn(0.0f);
      }
    }
  }
};

// Step 5 of a CTA: W2 of all routes for output tile `tile` (32 columns, m8n8k4), then the
// router-weighted sum. Warp r handles route r: its 5 groups of W2 are loaded first (they do not
// depend on h), then every thread of the CTA calls hand_off() (the strip's h and the grid
// barrier), then h_r is read from L2 and dotted.
template <bool kMeta3, typename HandOff>
__device__ __forceinline__ void w2_tile_unit(const MoeArgs& a, int tile, HandOff hand_off) {
  constexpr int kG = kGroups2;
  constexpr int kParts = WarpAcc::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kRoutes * kParts * kTile];
  __shared__ float ys[kRoutes * kTile];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int e = a.ids[route];
  const float weight = a.weights[route];  // read now: the combine at the end then waits for nothing
  const bool valid = route_is_valid(e, a.num_experts);
  const LaneMap lm(lane);
  GroupFrag<kMeta3> f[kG];
  if (valid) {
    const uint4* codes = reinterpret_cast<const uint4*>(
        a.w2 + static_cast<long long>(e) * kWords2 + tile * (kInter / 8) * kTile);
    const unsigned char* meta =
        static_cast<const unsigned char*>(a.s2) +
        (static_cast<long long>(e) * kGroups2 * kHidden + tile * kTile) * kRecordBytes;
#pragma unroll
    for (int g = 0; g < kG; ++g) load_group(f[g], codes, meta, kHidden * kRecordBytes, g, lm);
  }
  if (lane == 0) {
    wts[route] = weight;
    valid_s[route] = valid;
  }
  hand_off();

  if (valid) {
    // h_r was written by other CTAs: read it from L2 (this SM's L1 may hold an earlier call's
    // lines of the same buffer), straight into the registers of the lane's k slice of each group.
    const uint4* h4 = reinterpret_cast<const uint4*>(a.intermediate + route * kInter);
    uint4 hv[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) hv[g] = __ldcg(h4 + 4 * g + lm.kq);
    WarpAcc acc;
#pragma unroll
    for (int g = 0; g < kG; ++g) dot_group<kMeta3>(acc, f[g], hv[g]);
    // y_route = fp16(FP32 sum over k), per route; quadpair partials in ascending order.
    store_partials(acc, part + route * kParts * kTile, lane);
    __syncwarp();
    float y = 0.0f;
#pragma unroll
    for (int p = 0; p < kParts; ++p) y += part[(route * kParts + p) * kTile + lane];
    ys[route * kTile + lane] = __half2float(__float2half_rn(y));
  }
  __syncthreads();
  combine_routes<kTile>(ys, wts, valid_s, a.out, tile);
}

// Grid (kV100Ctas), kV100Threads threads, launched cooperatively (cudaLaunchCooperativeKernel):
// the barrier needs every CTA resident. One CTA per SM is all the V100 design asks, so the
// register cap is the whole file's share of 320 threads.
template <bool kMeta3>
__global__ void __launch_bounds__(kV100Threads, 1) v100_moe_kernel(MoeArgs a) {
  QPN_TRACE_STAMP(a, kTraceStart);
  const int cta = blockIdx.x;
  Strip<kMeta3> strip(a, cta);
  w13_swiglu_unit<kMeta3, kV100Warps>(a, cta % kTiles13, cta / kTiles13);
  strip.settle();
  w2_tile_unit<kMeta3>(a, cta, [&strip, &a]() {
    QPN_TRACE_STAMP(a, kTraceW2Issued);
    strip.finish(a);
    QPN_TRACE_STAMP(a, kTraceStripDone);
#ifdef QPN_TRACE
    if (a.trace_skip_barrier) return;  // traced build only: time the layer without the barrier
#endif
    const BarrierTicket ticket = grid_barrier_arrive();
    QPN_TRACE_STAMP(a, kTraceArrived);
    grid_barrier_wait(ticket);  // every h store of the grid is visible after it
    QPN_TRACE_STAMP(a, kTraceExited);
  });
  QPN_TRACE_STAMP(a, kTraceEnd);
}

}  // namespace qpn
