// Unit A (W13, SwiGLU, h) of both forms and its kernel, and the sm_90 default's kernel B (W2 of
// all routes for one 16-column output tile, the route combine) with the polled hand-off of h.

#pragma once

#include "awq_moe_m1_common.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// The polled hand-off (PolledH, awq_moe_m1_common.cuh): one slot per stream (and per stream of
// a graph capture), and the overflow slot last; the launcher passes the call's in MoeArgs::polled.
__device__ PolledH g_polled_h[kPolledSlots + 1];

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
// values of h into hs (shared, in order) and return true. Lane l reads words 2l, 2l + 1 and
// (l < 8) 64 + 2l, 65 + 2l. Returns false (hs untouched) after kMaxPolls polls without the tag;
// the count is the warp's, so the warp never diverges.
__device__ __forceinline__ bool poll_h(const PolledH* p, int route, unsigned tag, unsigned* hs,
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
    if (++polls == kMaxPolls) return false;
  }
  hs[2 * lane] = static_cast<unsigned>(v0.x);
  hs[2 * lane + 1] = static_cast<unsigned>(v0.y);
  if (lane < kTail) {
    hs[64 + 2 * lane] = static_cast<unsigned>(v1.x);
    hs[65 + 2 * lane] = static_cast<unsigned>(v1.y);
  }
  __syncwarp();
  return true;
}

// Warp `route` of unit B without the tag: wait for kernel A's completion (its memory is visible
// after it), then read h of the route from intermediate into hs, as poll_h lays it out. From L2:
// this SM's L1 may hold an earlier call's lines of the same buffer.
__device__ __forceinline__ void read_h_after_a(const __half* intermediate, int route, unsigned* hs,
                                               int lane) {
  pdl_wait_primary();
  const uint2* row = reinterpret_cast<const uint2*>(intermediate + route * kInter);
  constexpr int kPairs = kInter / 4;  // uint2 per row: 40
  reinterpret_cast<uint2*>(hs)[lane] = __ldcg(row + lane);
  if (lane + 32 < kPairs) reinterpret_cast<uint2*>(hs)[lane + 32] = __ldcg(row + lane + 32);
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

// ---------------------------------------------------------------------------------------------
// Unit A: W13 + SwiGLU for one (tile, route): 16 values of intermediate[route]. kWarpsA warps
// (dividing the 80 groups) split K; their FP32 partials meet in shared memory in warp order.
// kHandOff: kStoreH (the V100 design: h goes to intermediate only; its grid barrier hands it
// over) or kPublishTag (the sm_90 default: h is also published with the call's tag for kernel B's
// polls). Neither prefetches W2: 7.68 MB would not stay in a V100's 6 MB L2.
//
// Critical path: x is loaded before ids (it does not depend on them) and only stored to shared
// memory after the weight loads are issued, so the weight stream starts one round trip after
// the kernel starts, not two.
constexpr int kStoreH = 0;
constexpr int kPublishTag = 1;
template <bool kMeta3, bool kMma884, int kWarpsA, int kHandOff>
__device__ __forceinline__ void w13_swiglu_unit(const MoeArgs& a, int tile, int route) {
  constexpr bool kPublish = kHandOff == kPublishTag;
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
  const auto [e, h_out, valid] = unit_route(a, tile, route);
  if (!valid) {
    if (kPublish && warp == 0) {
      const unsigned seen = load_relaxed_gpu(&a.polled->epoch);
      publish_h(a.polled, route, tile, __float2half_rn(0.0f), seen + 1u, lane);
    }
    return;
  }
  // The tag is needed only at the end: its load is issued here and consumed (thread 0 stores it
  // to shared memory) after the weight loads are issued.
  unsigned epoch = 0;
  if (kPublish && threadIdx.x == 0) epoch = load_relaxed_gpu(&a.polled->epoch);
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
#pragma unroll
  for (int j = 0; j < kXPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < kXChunks) xs[warp][i] = xr[j];
  }
  // After x's stores: ptxas 13.0 spills kernel A's 4-byte form at 64 registers otherwise.
  if (kPublish && threadIdx.x == 0) tag_s = epoch + 1u;
  __syncwarp();

  WarpAcc<kMma884> acc;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    dot_group<kMeta3, kMma884>(acc, ring[g % kDepth], xs[warp][4 * g + lm.kq]);
    if (g + kDepth < kG) load_group(ring[g % kDepth], codes, meta, kMetaGroupBytes, g + kDepth, lm);
  }
  store_partials<kMma884>(acc, part + warp * kParts * kTile, lane);
  __syncthreads();

  if (warp == 0) {
    const __half h = swiglu_h<kWarpsA * kParts>(part, lane);
    if (kPublish) publish_h(a.polled, route, tile, h, tag_s, lane);  // kernel B polls it
    store_h(h, hs, h_out, lane);
  }
}

// Kernel A of the sm_90 default: grid (kTiles13, kRoutes), kWarpsA * 32 threads. kMinBlocks 2
// (at most 64 registers, no spills), so that a 16-column unit B fits beside each one.
template <bool kMeta3, bool kMma884, int kWarpsA, int kMinBlocks, int kHandOff>
__global__ void __launch_bounds__(kWarpsA * 32, kMinBlocks) w13_swiglu_kernel(MoeArgs a) {
  // The previous kernel (the router) writes ids and x: wait for it before reading them.
  pdl_wait_primary();
  // Kernel B only streams weights before it needs our h; let it be scheduled at once.
  pdl_launch_dependents();
  w13_swiglu_unit<kMeta3, kMma884, kWarpsA, kHandOff>(a, blockIdx.x, blockIdx.y);
}

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

// ---------------------------------------------------------------------------------------------
// Unit B of the sm_90 default: W2 of all routes for one 16-column output tile, then the
// router-weighted sum; warp r handles route r. Half the W2 bytes of a 32-column tile per CTA, so
// the 160 CTAs spread W2 over more SMs (one beside each unit A, the rest two to an SM), and
// half the registers of W2 per warp, so all five groups are dequantized before h arrives and
// only 10 MMAs remain after it. The groups' MMAs go to two accumulators (even and odd groups,
// added at the end: a fixed order, contract section 4), so the chain of dependent MMAs after h
// is 6 long instead of 10.
constexpr int kTiles2x16 = kHidden / kCols16;  // 160
constexpr int kChains2 = 2;

template <bool kMeta3>
__device__ __forceinline__ void w2_combine16_unit(const MoeArgs& a, int tile) {
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float ys[kRoutes * kCols16];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];
  __shared__ __align__(16) unsigned hsm[kRoutes][kInter / 2];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int e = a.ids[route];
  const float weight = a.weights[route];
  PolledH* const polled = a.polled;
  const bool tagged = a.tagged != 0;
  const unsigned tag = tagged ? load_relaxed_gpu(&polled->epoch) + 1u : 0u;
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
#pragma unroll
    for (int g = 0; g < kGroups2; ++g) dequant_cols16<kMeta3>(q[g], f[g]);
  }
  if (lane == 0) {
    wts[route] = weight;
    valid_s[route] = valid;
  }
  // Every route is polled, valid or not, so that the call's last unit B counts in after every
  // unit A has published.
  if (!tagged || !poll_h(polled, route, tag, hsm[route], lane)) {
    read_h_after_a(a.intermediate, route, hsm[route], lane);
  }

  if (valid) {
    float d[kChains2][4] = {};
#pragma unroll
    for (int g = 0; g < kGroups2; ++g) {
      const uint4 hv = reinterpret_cast<const uint4*>(hsm[route])[4 * g + (lane & 3)];
      mma_cols16(d[g % kChains2], q[g], hv);
    }
    const float y0 = d[0][0] + d[1][0];
    const float y1 = d[0][2] + d[1][2];
    // y_route = fp16(FP32 sum over k): lanes (g, 0) hold columns 2g and 2g + 1.
    if ((lane & 3) == 0) {
      ys[route * kCols16 + (lane >> 1)] = __half2float(__float2half_rn(y0));
      ys[route * kCols16 + (lane >> 1) + 1] = __half2float(__float2half_rn(y1));
    }
  }
  __syncthreads();
  if (tagged && threadIdx.x == 32) {
    count_in(&polled->arrived, &polled->epoch, kTiles2x16, tag - 1u);
  }
  combine_routes<kCols16>(ys, wts, valid_s, a.out, tile);
  // What follows kernel B on the stream waits for its completion; waiting here for kernel A's
  // (immediate by now) makes that completion imply kernel A's too.
  pdl_wait_primary();
}

// Kernel B of the sm_90 default: grid (kTiles2x16), kWarpsB * 32 threads, at most 80 registers,
// so that each quarter of an SM's register file (16384, one per warp scheduler) holds kernel A's
// 4 warps at 64 registers beside 3 warps of this kernel, and every B CTA is resident beside the
// A CTAs from the start, streaming its W2 behind their W13. Compilers without __maxnreg__
// (before CUDA 12.4) get plain launch bounds: correct, only not co-resident.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define QPN_B_CAPPED_BOUNDS(regs) __maxnreg__(regs)
#else
#define QPN_B_CAPPED_BOUNDS(regs) __launch_bounds__(kWarpsB * 32)
#endif
template <bool kMeta3>
__global__ void QPN_B_CAPPED_BOUNDS(80) w2_combine16_kernel(MoeArgs a) {
  pdl_launch_dependents();  // it waits for kernel A's completion at its end
  w2_combine16_unit<kMeta3>(a, blockIdx.x);
}

}  // namespace qpn
