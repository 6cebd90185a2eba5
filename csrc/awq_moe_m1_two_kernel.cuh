// The two-kernel form (the default everywhere; on sm_90 with the polled hand-off of h) and the
// fused single launch that reuses its units: unit A (W13, SwiGLU, h), unit B (W2 of all routes
// for one output tile, the route combine), their kernels, and the hand-offs of h.

#pragma once

#include "awq_moe_m1_common.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// Hand-off of h between the units of one fused launch: per-route arrival counters in this
// module. Every call leaves them at zero (the last unit B of a call resets them), so calls on
// one device must not run concurrently; the route's calls are one per MoE layer on the model's
// stream.

struct FusedSync {
  unsigned route_ready[kRoutes];  // unit A completions per route (kTiles13 when h_r is whole)
  unsigned b_waited;              // unit B warps past their wait in the current call
};
__device__ FusedSync g_fused_sync;

__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Unit A's signal: its h stores (made by lanes 0..15 of warp 0, the caller) are fenced, then
// one relaxed add publishes them (fence + relaxed write = a release pattern).
__device__ __forceinline__ void signal_h_ready(int route, int lane) {
  fence_acq_rel_gpu();
  __syncwarp();
  if (lane == 0) atomicAdd(&g_fused_sync.route_ready[route], 1u);
}

// A warp of unit B waits until all kTiles13 units A of `route` have published h (relaxed polls,
// then a fence: an acquire pattern). A count that never arrives means concurrent calls on one
// device or a broken launch: trap after 2^24 polls (seconds) instead of hanging the server.
__device__ __forceinline__ void wait_h_ready(int route) {
  unsigned polls = 0;
  while (load_relaxed_gpu(&g_fused_sync.route_ready[route]) < static_cast<unsigned>(kTiles13)) {
    if (++polls > (1u << 24)) __trap();
  }
  fence_acq_rel_gpu();
}

// The polled hand-off (PolledH, awq_moe_m1_common.cuh): its one instance; the kernels take its
// address from MoeArgs::polled (awq_moe_m1_split.cuh says why).
__device__ PolledH g_polled_h;

// Warp 0 of unit A (tile, route), lanes 0..15 holding h[16 tile + lane]: the even lanes publish
// the pairs, each with the tag, in one 64-bit store.
__device__ __forceinline__ void publish_h(PolledH* p, int route, int tile, __half h, unsigned tag,
                                          int lane) {
  const unsigned mine = __half_as_ushort(h);
  const unsigned next = __shfl_down_sync(0xffffffffu, mine, 1);
  if (lane < kTile / 2 && (lane & 1) == 0) {
    const unsigned long long word =
        (static_cast<unsigned long long>(tag) << 32) | (next << 16) | mine;
    store_relaxed_gpu(&p->words[route][tile * (kTile / 4) + lane / 2], word);
  }
}

// Warp `route` of unit B: poll the route's 80 words until each carries the tag, then put the 160
// values of h into hs (shared, in order). Lane l reads words 2l, 2l + 1 and (l < 8) 64 + 2l,
// 65 + 2l. A tag that never arrives means concurrent calls on one device or a broken launch:
// trap after 2^22 polls (about a second) instead of hanging the server.
__device__ __forceinline__ void poll_h(const PolledH* p, int route, unsigned tag, unsigned* hs,
                                       int lane) {
  constexpr int kWords = kInter / 2;
  constexpr int kTail = (kWords - 64) / 2;  // lanes that read a second pair
  static_assert(kWords > 64 && kWords <= 128 && kWords % 2 == 0, "two pairs per lane at most");
  const unsigned long long* w = p->words[route];
  const unsigned long long fresh = static_cast<unsigned long long>(tag) << 32;
  ulonglong2 v0, v1 = make_ulonglong2(fresh, fresh);
  unsigned polls = 0;
  for (;;) {
    v0 = load_relaxed_gpu(w + 2 * lane);
    if (lane < kTail) v1 = load_relaxed_gpu(w + 64 + 2 * lane);
    const bool ok = (v0.x >> 32) == tag && (v0.y >> 32) == tag && (v1.x >> 32) == tag &&
                    (v1.y >> 32) == tag;
    if (__all_sync(0xffffffffu, ok)) break;
    if (++polls > (1u << 22)) __trap();
  }
  hs[2 * lane] = static_cast<unsigned>(v0.x);
  hs[2 * lane + 1] = static_cast<unsigned>(v0.y);
  if (lane < kTail) {
    hs[64 + 2 * lane] = static_cast<unsigned>(v1.x);
    hs[65 + 2 * lane] = static_cast<unsigned>(v1.y);
  }
  __syncwarp();
}

// One unit of a call counts itself in (after reading `seen` from `epoch`, as every unit of the
// call did); the last of `units` resets the count and advances the epoch, so no unit of this call
// reads the new one.
__device__ __forceinline__ void count_in(unsigned* arrived, unsigned* epoch, int units,
                                         unsigned seen) {
  if (atomicAdd(arrived, 1u) == static_cast<unsigned>(units) - 1u) {
    *arrived = 0u;
    store_relaxed_gpu(epoch, seen + 1u);
  }
}

// Kernel A's CTA (tile, route) prefetches tile/10 of the route's W2 (codes and metadata, each
// contiguous per expert) into L2 right after issuing its W13 loads, so W2 streams from HBM while
// W13 is computed and kernel B's loads hit L2 whether or not its CTAs were resident early.
// One 128 B line per thread: 160 lines of codes, then 40 (4-byte) or 30 (3-byte) of metadata.
template <bool kMeta3>
__device__ __forceinline__ void prefetch_w2_share(const MoeArgs& a, int e, int tile, int i) {
  constexpr int kLine = 128;
  constexpr int kCodeBytes = kWords2 * 4 / kTiles13;                      // 20480
  constexpr int kMetaBytes = kGroups2 * kHidden * (kMeta3 ? 3 : 4) / kTiles13;  // 5120 or 3840
  constexpr int kCodeLines = kCodeBytes / kLine;
  constexpr int kLines = kCodeLines + (kMetaBytes + kLine - 1) / kLine;
  if (i < kCodeLines) {
    const char* base = reinterpret_cast<const char*>(a.w2 + static_cast<long long>(e) * kWords2);
    prefetch_l2(base + tile * kCodeBytes + i * kLine);
  } else if (i < kLines) {
    const char* base = static_cast<const char*>(a.s2) +
                       static_cast<long long>(e) * (kGroups2 * kHidden * (kMeta3 ? 3 : 4));
    prefetch_l2(base + tile * kMetaBytes + (i - kCodeLines) * kLine);
  }
}

// ---------------------------------------------------------------------------------------------
// Unit A: W13 + SwiGLU for one (tile, route): 16 values of intermediate[route]. kWarpsA warps
// (dividing the 80 groups) split K; their FP32 partials meet in shared memory in warp order.
// kSignal: publish h through g_fused_sync (the fused form).
//
// Critical path: x is loaded before ids (it does not depend on them) and only stored to shared
// memory after the weight loads are issued, so the weight stream starts one round trip after
// the kernel starts, not two.

// kLoadOnly (tuning runs only): stream the W13 loads as usual but skip the arithmetic (h is then
// meaningless), which times kernel A's memory traffic alone.
// kLateW2 (tuning runs, with kernel B's kW2AfterWait): prefetch the W2 share only once the
// tile's W13 has landed instead of right after issuing it, so that W13 is served first.
// kPublish: also publish h with the call's tag (the polled hand-off, PolledH): kPublishTag.
constexpr int kNoPublish = 0;
constexpr int kPublishTag = 1;
template <bool kMeta3, bool kMma884, int kWarpsA, bool kSignal, bool kLoadOnly = false,
          bool kLateW2 = false, int kPublish = kNoPublish>
__device__ __forceinline__ void w13_swiglu_unit(const MoeArgs& a, int tile, int route) {
  constexpr int kG = kGroups13 / kWarpsA;
  constexpr int kDepth = kG < kMaxDepthA ? kG : kMaxDepthA;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  constexpr int kXChunks = kG * 4;  // 16 B chunks of x in this warp's k slice
  constexpr int kXPerLane = (kXChunks + 31) / 32;
  __shared__ float part[kWarpsA * kParts * kTile];
  __shared__ uint4 xs[kWarpsA][kXChunks];
  __shared__ __align__(16) __half hs[kTile / 2];
  __shared__ unsigned tag_s;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g0 = warp * kG;
  uint4 xr[kXPerLane];
#pragma unroll
  for (int j = 0; j < kXPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < kXChunks) xr[j] = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + i);
  }
  const auto [slot, e, h_out, valid] = unit_route(a, tile, route);
  if (!valid) {
    if (kSignal && warp == 0) signal_h_ready(route, lane);
    if (kPublish != kNoPublish && warp == 0) {
      const unsigned seen = load_relaxed_gpu(&a.polled->epoch);
      publish_h(a.polled, route, tile, __float2half_rn(0.0f), seen + 1u, lane);
    }
    return;
  }
  // The tag is needed only at the end: its load is issued here and consumed (thread 0 stores it
  // to shared memory) after the weight loads are issued.
  unsigned epoch = 0;
  if (kPublish != kNoPublish && threadIdx.x == 0) epoch = load_relaxed_gpu(&a.polled->epoch);
  const LaneMap<kMma884> lm(lane);
  const uint4* codes = reinterpret_cast<const uint4*>(
      a.w13 + static_cast<long long>(e) * kWords13 + (tile * (kHidden / 8) + 4 * g0) * kTile);
  const unsigned char* meta =
      static_cast<const unsigned char*>(a.s13) +
      (static_cast<long long>(e) * kGroups13 * kN13 + g0 * kN13 + tile * kTile) * kRecordBytes;
  constexpr int kMetaGroupBytes = kN13 * kRecordBytes;
  GroupFrag<kMeta3> ring[kDepth];
#pragma unroll
  for (int g = 0; g < kDepth; ++g) load_group(ring[g], codes, meta, kMetaGroupBytes, g, lm);
  if (!kSignal && !kLateW2 && (a.diag & kDiagNoW2Prefetch) == 0) {
    prefetch_w2_share<kMeta3>(a, e, tile, threadIdx.x);
  }
  if (kPublish != kNoPublish && threadIdx.x == 0) tag_s = epoch + 1u;
#pragma unroll
  for (int j = 0; j < kXPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < kXChunks) xs[warp][i] = xr[j];
  }
  __syncwarp();

  WarpAcc<kMma884> acc;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if constexpr (kLoadOnly) {
      const GroupFrag<kMeta3>& f = ring[g % kDepth];
      acc.d[0][0] += __uint_as_float((f.codes.x ^ f.codes.y ^ f.codes.z ^ f.codes.w ^ f.meta.x ^
                                      f.meta.y ^ f.meta.z ^ f.meta.w) & 0x3fffffffu);
    } else {
      dot_group<kMeta3, kMma884>(acc, ring[g % kDepth], xs[warp][4 * g + lm.kq]);
    }
    if (g + kDepth < kG) load_group(ring[g % kDepth], codes, meta, kMetaGroupBytes, g + kDepth, lm);
  }
  store_partials<kMma884>(acc, part + warp * kParts * kTile, lane);
  trace_stamp_after(slot, 4, acc.d[0][0] + acc.d[1][0]);  // warp 0's dots done
  __syncthreads();
  trace_stamp(slot, 2);  // every warp's dot products done
  if (kLateW2 && warp != 0) {
    // All of the tile's W13 is in. Warps 1.. prefetch (warp 0 goes on to SwiGLU); the id is
    // read again (from cache) rather than kept live through the loop at 64 registers.
    prefetch_w2_share<kMeta3>(a, __ldcs(&a.ids[route]), tile, static_cast<int>(threadIdx.x) - 32);
  }

  if (warp == 0) {
    const __half h = swiglu_h<kWarpsA * kParts>(part, lane);
    if (kPublish != kNoPublish) publish_h(a.polled, route, tile, h, tag_s, lane);  // B polls it
    store_h(h, hs, h_out, lane);
    trace_stamp(slot, 3);  // h stored
    trace_flush(slot);
    if (kSignal) signal_h_ready(route, lane);
  }
}

// How unit B gets h: kWaited, after `wait_for_h` (kernel A's completion, or the fused form's
// counter), read from intermediate; kPolledThenWait, polled as kernel A publishes it (PolledH),
// then at the unit's end a wait for kernel A's completion (immediate by then) so that what
// follows kernel B also follows kernel A; kPolledNoEndWait, the same without that wait (tuning
// runs only, to measure it).
constexpr int kWaited = 0;
constexpr int kPolledThenWait = 1;
constexpr int kPolledNoEndWait = 2;
constexpr int kW2AtStart = 0;
constexpr int kW2Delayed = 1;
constexpr int kW2AfterWait = 2;

// The end of a unit B: threads 0 .. kCols - 1 combine the routes' y (FP16 values in FP32,
// ys[route][column]) in router order and store output tile `tile` of kCols columns.
template <int kCols>
__device__ __forceinline__ void combine_routes(const float* ys, const float* wts,
                                               const int* valid_s, __half* out, int tile) {
  if (threadIdx.x < kCols) {
    const int c = threadIdx.x;
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) {
      // Invalid routes contribute exactly zero (skipped, so a NaN weight there cannot leak).
      if (valid_s[r]) acc = fmaf(wts[r], ys[r * kCols + c], acc);
    }
    out[tile * kCols + c] = __float2half_rn(acc);
  }
}

// Unit B: W2 of all routes for one 32-column output tile, then the router-weighted sum.
// kWarpsB warps; warp r handles route r. `wait_for_h(r)` runs after the W2 loads are issued and
// before h_r is read (PDL in the two-kernel form, the route's counter in the fused form).
// kPreDequant: dequantize that many of the kGroups2 groups of W2 while waiting for h, into
// registers (16 per group and lane instead of the codes' 8), so that only their MMAs remain after
// the wait; the others are dequantized after it. Used where the wait is real (PDL on
// sm_90); without PDL kernel B starts after A has finished, and issuing the h loads right after
// the W2 loads (one round trip for both) is better than dequantizing in between.
// (Measured on the H200, `scripts/op_timing.py`, 4-byte, us/layer: dequant after the wait 7.17,
// before it in registers 6.85, in shared memory with kernel B capped at 64 registers so that its
// CTAs fit beside kernel A's 6.77; kernel B capped at 64 registers alone 7.00. The shared-memory
// form, traced, starts all 80 B CTAs at once but spends 1.8 us after the wait and slows kernel
// A beside it (commit 2a4857f, docs/evidence/bsmem/); it also needs 100 KB per CTA, which
// sm_86/sm_89 do not have. Not kept.)
// kW2When: when the W2 loads are issued. kW2AtStart, the default; the tuning variants, both
// meant to have kernel A's W13 served first so that h is published while W2 still streams:
// kW2Delayed holds them back a.b_delay_ns after the CTA starts, kW2AfterWait issues them after
// the wait, when kernel A (kLateW2) has prefetched them into L2 as its W13 landed.
// kHandOff (polled): instead of `wait_for_h`, each warp polls its route's published h (PolledH),
// every route whether valid or not (so that the call's last unit B arrives after every unit A
// has published); then the unit counts itself in and, with kPolledThenWait, waits for kernel
// A's completion at its very end.
template <bool kMeta3, bool kMma884, int kPreDequant = 0, int kW2When = kW2AtStart,
          int kHandOff = kWaited, typename WaitForH>
__device__ __forceinline__ void w2_combine_unit(const MoeArgs& a, int tile, WaitForH wait_for_h) {
  static_assert(kHandOff == kWaited || kW2When != kW2AfterWait, "the polled hand-off has no wait");
  constexpr int kG = kGroups2;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kWarpsB * kParts * kTile];
  __shared__ float ys[kRoutes * kTile];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];
  __shared__ __align__(16) unsigned hsm[kHandOff != kWaited ? kRoutes : 1][kInter / 2];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = kTiles13 * kRoutes + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  const float weight = a.weights[route];  // read now: the combine at the end then waits for nothing
  const unsigned tag = kHandOff != kWaited ? load_relaxed_gpu(&a.polled->epoch) + 1u : 0u;
  const bool valid = route_is_valid(e, a.num_experts);
  const LaneMap<kMma884> lm(lane);
  GroupFrag<kMeta3> f[kG];
  if constexpr (kW2When == kW2Delayed) {
    const unsigned long long until = global_ns() + static_cast<unsigned>(a.b_delay_ns);
    while (global_ns() < until) __nanosleep(64);
  }
  if constexpr (kW2When == kW2AfterWait) wait_for_h(route);
  if (valid) {
    // W2 does not depend on h: stream it in before waiting.
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
  GroupWeights q[kPreDequant > 0 ? kPreDequant : 1];
  if (kPreDequant > 0 && valid) {
#pragma unroll
    for (int g = 0; g < kPreDequant; ++g) dequant_group<kMeta3>(q[g], f[g]);
  }
  trace_stamp(slot, 1);  // ready to wait (route 0's W2 loaded and, with PDL, dequantized)
  if constexpr (kHandOff != kWaited) {
    poll_h(a.polled, route, tag, hsm[route], lane);
  } else if constexpr (kW2When != kW2AfterWait) {
    wait_for_h(route);
  }
  trace_stamp(slot, 2);  // h may be read

  if (valid) {
    // h_r was written by other CTAs (this launch or the previous one): read it from L2, straight
    // into the registers that hold the lane's k slice of each group.
    const uint4* h4 = reinterpret_cast<const uint4*>(a.intermediate + route * kInter);
    uint4 hv[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if constexpr (kHandOff != kWaited) {
        hv[g] = reinterpret_cast<const uint4*>(hsm[route])[4 * g + lm.kq];
      } else {
        hv[g] = __ldcg(h4 + 4 * g + lm.kq);
      }
    }
    WarpAcc<kMma884> acc;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g < kPreDequant) {
        mma_group<kMma884>(acc, q[g < kPreDequant ? g : 0], hv[g]);
      } else {
        dot_group<kMeta3, kMma884>(acc, f[g], hv[g]);
      }
    }
    // y_route = fp16(FP32 sum over k), per route; quadpair partials in ascending order.
    float y = 0.0f;
    if constexpr (kMma884) {
      store_partials<kMma884>(acc, part + route * kParts * kTile, lane);
      __syncwarp();
#pragma unroll
      for (int p = 0; p < kParts; ++p) y += part[(route * kParts + p) * kTile + lane];
    } else {
      y += lane_column(acc, lane);  // one part, already in the lane of its column
    }
    trace_stamp_after(slot, 4, y);  // route 0's y summed
    ys[route * kTile + lane] = __half2float(__float2half_rn(y));
  }
  __syncthreads();
  trace_stamp(slot, 5);  // every route's y in
  if (kHandOff != kWaited && threadIdx.x == 32) {
    count_in(&a.polled->arrived, &a.polled->epoch, kTiles2, tag - 1u);
  }

  combine_routes<kTile>(ys, wts, valid_s, a.out, tile);
  trace_stamp(slot, 3);  // out stored
  trace_flush(slot);
  if constexpr (kHandOff == kPolledThenWait) pdl_wait_primary();
}

// Unit B of 16 columns (the polled form's kernel B with 160 CTAs, sm_90 with PDL): W2 of all
// routes for one 16-column output tile, then the router-weighted sum. Against the 32-column
// unit: half the W2 bytes per CTA, so the 160 CTAs spread W2 over more SMs (one beside each
// unit A, the rest two to an SM); half the registers of W2 per warp, so all five groups are
// dequantized before the poll and only 10 MMAs remain after it. With one accumulator chain each
// column's sums are bit for bit the 32-column unit's (mma_cols16).
// kDequantLate (tuning runs): dequantize W2 after the poll instead of while kernel A streams
// (one unit B sits beside every unit A, and both issue from the SM's four schedulers).
// kChains: the groups' MMAs in that many accumulators, group g in chain g % kChains, added at
// the end in a fixed order (contract section 4 allows any deterministic one). 2, the default:
// the even and the odd groups, so the chain of dependent MMAs after the poll is 6 long instead
// of 10 (bench op on the H200, commit 4a91aa7: 5.12 / 5.41 us net, 4-byte / 3-byte, against
// 5.19 / 5.44 with one chain, whose sums are bit for bit the waiting kernel B's); 5 (tuning
// runs): one per group, ((0 + 1) + (2 + 3)) + 4.
constexpr int kTiles2x16 = kHidden / kCols16;  // 160

template <int kChains>
__device__ __forceinline__ float sum_chains(const float (&d)[kChains][4], int i) {
  static_assert(kChains == 1 || kChains == 2 || kChains == kGroups2, "1, 2 or 5 chains");
  if constexpr (kChains == 1) return d[0][i];
  if constexpr (kChains == 2) return d[0][i] + d[1][i];
  if constexpr (kChains == kGroups2) {
    return ((d[0][i] + d[1][i]) + (d[2][i] + d[3][i])) + d[4][i];
  }
}

// kLoadOnly (tuning runs): no dequantization and no MMAs (y meaningless, made from the loaded
// words and h so that every load and the poll stay; the dequantized weights' registers filled by
// one XOR per word so that residency stays the default's): what kernel B's arithmetic costs.
template <bool kMeta3, bool kDequantLate = false, int kChains = 2, bool kLoadOnly = false>
__device__ __forceinline__ void w2_combine16_unit(const MoeArgs& a, int tile) {
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float ys[kRoutes * kCols16];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];
  __shared__ __align__(16) unsigned hsm[kRoutes][kInter / 2];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = kTiles13 * kRoutes + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  const float weight = a.weights[route];
  const unsigned tag = load_relaxed_gpu(&a.polled->epoch) + 1u;
  const bool valid = route_is_valid(e, a.num_experts);
  Cols16Weights q[kGroups2];
  Cols16Frag<kMeta3> f[kGroups2];
  if (valid) {
    // The bank's 32-column tile tile / 2, its half tile & 1 (words 16 .. 31 of each k block).
    const uint2* codes = reinterpret_cast<const uint2*>(
        a.w2 + static_cast<long long>(e) * kWords2 + (tile / 2) * (kInter / 8) * kTile +
        (tile & 1) * kCols16);
    const unsigned char* meta =
        static_cast<const unsigned char*>(a.s2) +
        (static_cast<long long>(e) * kGroups2 * kHidden + tile * kCols16 + 2 * (lane >> 2)) *
            kRecordBytes;
#pragma unroll
    for (int g = 0; g < kGroups2; ++g) {
      load_cols16(f[g], codes, meta, kHidden * kRecordBytes, g, lane);
    }
    if constexpr (kLoadOnly) {
      // Registers as the dequantized weights' (so that the kernel's residency stays the
      // default's), made by one XOR per word instead of the dequantization.
#pragma unroll
      for (int g = 0; g < kGroups2; ++g) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned word[4] = {f[g].codes.x, f[g].codes.y, f[g].meta.x, f[g].meta.y};
          q[g].w[i / 4][i % 4] = word[i % 4] ^ (0x9e3779b9u * (i + 1));
        }
      }
    } else if constexpr (!kDequantLate) {
#pragma unroll
      for (int g = 0; g < kGroups2; ++g) dequant_cols16<kMeta3>(q[g], f[g]);
    }
  }
  if (lane == 0) {
    wts[route] = weight;
    valid_s[route] = valid;
  }
  trace_stamp(slot, 1);  // ready to wait (route 0's W2 loaded and dequantized)
  poll_h(a.polled, route, tag, hsm[route], lane);
  trace_stamp(slot, 2);  // h in

  if (valid) {
    float y0, y1;
    if constexpr (kLoadOnly) {
      unsigned bits = hsm[route][lane];
#pragma unroll
      for (int g = 0; g < kGroups2; ++g) {
#pragma unroll
        for (int i = 0; i < 8; ++i) bits += q[g].w[i / 4][i % 4] << i;
      }
      y0 = y1 = __uint_as_float(bits & 0x3fffffffu);
    } else {
      if constexpr (kDequantLate) {
#pragma unroll
        for (int g = 0; g < kGroups2; ++g) dequant_cols16<kMeta3>(q[g], f[g]);
      }
      float d[kChains][4] = {};
#pragma unroll
      for (int g = 0; g < kGroups2; ++g) {
        const uint4 hv = reinterpret_cast<const uint4*>(hsm[route])[4 * g + (lane & 3)];
        mma_cols16(d[g % kChains], q[g], hv);
      }
      y0 = sum_chains<kChains>(d, 0);
      y1 = sum_chains<kChains>(d, 2);
    }
    trace_stamp_after(slot, 4, y0);  // route 0's y summed
    // y_route = fp16(FP32 sum over k): lanes (g, 0) hold columns 2g and 2g + 1.
    if ((lane & 3) == 0) {
      ys[route * kCols16 + (lane >> 1)] = __half2float(__float2half_rn(y0));
      ys[route * kCols16 + (lane >> 1) + 1] = __half2float(__float2half_rn(y1));
    }
  }
  __syncthreads();
  trace_stamp(slot, 5);  // every route's y in
  if (threadIdx.x == 32) count_in(&a.polled->arrived, &a.polled->epoch, kTiles2x16, tag - 1u);
  combine_routes<kCols16>(ys, wts, valid_s, a.out, tile);
  trace_stamp(slot, 3);  // out stored
  trace_flush(slot);
  pdl_wait_primary();
}

// ---------------------------------------------------------------------------------------------
// Two-kernel form (every arch): kernel A then kernel B. On sm_90 both are programmatic
// dependents: A's CTAs are resident when the previous kernel ends, B's W2 loads overlap A.

// Kernel A: grid (kTiles13, kRoutes), kWarpsA * 32 threads. kWarpsA other than warps_a() exists
// for tuning runs. kMinBlocks 2 (at most 64 registers, no spills) is the sm_90 PDL form's kernel
// A, beside w2_combine_capped_kernel.
template <bool kMeta3, bool kMma884, int kWarpsA = warps_a(kMma884), bool kLoadOnly = false,
          int kMinBlocks = QPN_A_MIN_BLOCKS, bool kLateW2 = false, int kPublish = kNoPublish>
__global__ void __launch_bounds__(kWarpsA * 32, kMinBlocks) w13_swiglu_kernel(MoeArgs a) {
  // The previous kernel (the router) writes ids and x: wait for it before reading them.
  pdl_wait_primary();
  // Kernel B only prefetches weights before waiting for us; let it be scheduled at once.
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  w13_swiglu_unit<kMeta3, kMma884, kWarpsA, false, kLoadOnly, kLateW2, kPublish>(a, blockIdx.x,
                                                                                blockIdx.y);
}

// Kernel B: grid (kTiles2), kWarpsB * 32 threads.
// The launch-only tuning run of a kernel B (both kernels exit after reading ids): true if the
// kernel is to exit now; the ids are read and kept alive.
__device__ __forceinline__ bool b_launch_only(const MoeArgs& a) {
  if ((a.diag & kDiagLaunchOnly) == 0) return false;
  if (a.ids[threadIdx.x >> 5] == -12345) a.out[0] = __float2half_rn(0.0f);
  return true;
}

template <bool kMeta3, bool kMma884, int kPreDequant = 0, int kW2When = kW2AtStart,
          int kHandOff = kWaited>
__device__ __forceinline__ void w2_combine_body(const MoeArgs& a) {
  if (b_launch_only(a)) return;
  // Polled: nothing to wait for but h itself (the unit waits for kernel A's completion last).
  if (kHandOff != kWaited) pdl_launch_dependents();
  w2_combine_unit<kMeta3, kMma884, kPreDequant, kW2When, kHandOff>(a, blockIdx.x, [](int) {
    // The next layer's kernels may be scheduled now; they wait for our completion themselves.
    pdl_launch_dependents();
    pdl_wait_primary();  // kernel A's intermediate is complete and visible after this
  });
}

template <bool kMeta3, bool kMma884, int kPreDequant = 0, int kW2When = kW2AtStart>
__global__ void __launch_bounds__(kWarpsB * 32) w2_combine_kernel(MoeArgs a) {
  w2_combine_body<kMeta3, kMma884, kPreDequant, kW2When>(a);
}

// Kernel B of the two-kernel form with PDL on sm_90 (m16n8k16): at most 80 registers, 3 of its 5
// groups dequantized while it waits. Each quarter of an SM's register file (16384, one per warp
// scheduler) then holds kernel A's 4 warps at 64 registers (kernel A with kMinBlocks 2) beside 3
// warps of this kernel, so all 80 B CTAs are resident from the start, issuing their W2 loads
// behind kernel A's W13 loads. With all 5 groups dequantized (94 registers) 16 of them waited
// for kernel A's CTAs to retire (H200, docs/performance.md section 4). Compilers without
// __maxnreg__ (before CUDA 12.4) get plain launch bounds: correct, only not co-resident.
// kW2AfterWait (tuning runs, kernel B loading W2 after the wait): nothing to hold before the
// wait, so 64 registers, beside a kernel A of 80 (4 x 2560 + 3 x 2048 = 16384 per quarter).
// kHandOff: kWaited, or the polled hand-off of h (PolledH) with kernel A publishing (kPublish).
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define QPN_B_CAPPED_BOUNDS(regs) __maxnreg__(regs)
#else
#define QPN_B_CAPPED_BOUNDS(regs) __launch_bounds__(kWarpsB * 32)
#endif
constexpr int kCappedPreDequant = 3;
template <bool kMeta3, int kW2When = kW2AtStart, int kHandOff = kWaited>
__global__ void QPN_B_CAPPED_BOUNDS(kW2When == kW2AfterWait ? 64 : 80)
    w2_combine_capped_kernel(MoeArgs a) {
  w2_combine_body<kMeta3, false, kW2When == kW2AfterWait ? 0 : kCappedPreDequant, kW2When,
                  kHandOff>(a);
}

// Kernel B of 16 columns (w2_combine16_unit): grid (kTiles2x16), kWarpsB * 32 threads, at most
// 80 registers like the capped kernel B, so one CTA fits beside each kernel A CTA.
template <bool kMeta3, bool kDequantLate = false, int kChains = 2, bool kLoadOnly = false>
__global__ void QPN_B_CAPPED_BOUNDS(80) w2_combine16_kernel(MoeArgs a) {
  if (b_launch_only(a)) return;
  pdl_launch_dependents();  // it waits for kernel A's completion at its end
  w2_combine16_unit<kMeta3, kDequantLate, kChains, kLoadOnly>(a, blockIdx.x);
}

// ---------------------------------------------------------------------------------------------
// Fused form (sm_80+, used when all kFusedCtas CTAs can be resident at once, so a waiting CTA
// can never keep a producing CTA from running): one launch, CTAs [0, 100) run unit A and CTAs
// [100, 180) unit B. The B CTAs issue their W2 loads at once, then each warp waits for its own
// route's 10 A units (g_fused_sync), so W2 streams in parallel with W13 and no kernel boundary
// sits between them.

constexpr int kFusedWarps = kWarpsB;  // 10 warps: unit A then splits K in 8-group slices
constexpr int kFusedCtasA = kTiles13 * kRoutes;
constexpr int kFusedCtas = kFusedCtasA + kTiles2;

template <bool kMeta3>
__global__ void __launch_bounds__(kFusedWarps * 32, 2) fused_moe_kernel(MoeArgs a) {
  pdl_wait_primary();  // ids and x are final after this (and the previous call has completed)
  pdl_launch_dependents();
  if (blockIdx.x < kFusedCtasA) {
    w13_swiglu_unit<kMeta3, false, kFusedWarps, true>(a, blockIdx.x % kTiles13,
                                                      blockIdx.x / kTiles13);
    return;
  }
  // Each warp takes a ticket once past its wait; the result is only needed at the end, so the
  // atomic's round trip overlaps the W2 work. The last ticket of the call (every warp of every
  // unit B is past its wait, so every unit A has arrived) leaves the counters at zero.
  unsigned ticket = 0;
  w2_combine_unit<kMeta3, false>(a, blockIdx.x - kFusedCtasA, [&ticket](int route) {
    wait_h_ready(route);
    if ((threadIdx.x & 31) == 0) ticket = atomicAdd(&g_fused_sync.b_waited, 1u);
  });
  if ((threadIdx.x & 31) == 0 && ticket == static_cast<unsigned>(kTiles2 * kWarpsB) - 1u) {
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) g_fused_sync.route_ready[r] = 0u;
    g_fused_sync.b_waited = 0u;
  }
}

// ---------------------------------------------------------------------------------------------
// Fused polled form (tuning runs, sm_90 with PDL): the two-kernel form's units in one launch of
// kFusedCtas CTAs of 16 warps at 64 registers (two per SM, so all 180 are resident where
// fused_polled_fits says so): CTAs [0, 100) run unit A and publish h as the polled form does,
// CTAs [100, 180) run unit B with warps 0..9 (all of W2 dequantized after the poll: nothing
// held back at 64 registers) while warps 10..15 only meet its one barrier. One grid instead of
// two: what the second kernel's launch and completion cost (both kernels exiting right after
// reading ids: 1.63 us net against the read floor's 0.91 with every id invalid) is what it
// tries to save. Measured on the H200 (commit 33fd223, `bench op --op-path fused-polled`): every
// id invalid 1.89 against 2.58 us, but a real call 6.64 against 5.44 us (4-byte): unit B's W2
// loads start with unit A's, and all of W2 is dequantized after h (docs/performance.md).
constexpr int kFusedPolledWarps = 16;
static_assert(kFusedPolledWarps >= kWarpsB, "unit B needs a warp per route");
template <bool kMeta3>
__global__ void __launch_bounds__(kFusedPolledWarps * 32, 2) fused_polled_kernel(MoeArgs a) {
  pdl_wait_primary();  // ids and x are final after this (and the previous call has completed)
  pdl_launch_dependents();
  if (blockIdx.x < kFusedCtasA) {
    w13_swiglu_unit<kMeta3, false, kFusedPolledWarps, false, false, false, kPublishTag>(
        a, blockIdx.x % kTiles13, blockIdx.x / kTiles13);
    return;
  }
  if (threadIdx.x >= kWarpsB * 32) {
    __syncthreads();  // unit B's one barrier counts every thread of the CTA
    return;
  }
  w2_combine_unit<kMeta3, false, 0, kW2AtStart, kPolledNoEndWait>(a, blockIdx.x - kFusedCtasA,
                                                                   [](int) {});
}

}  // namespace qpn
