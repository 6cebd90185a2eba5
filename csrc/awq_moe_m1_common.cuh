// The parts of the V100 design (awq_moe_m1_v100.cuh) that are not about its grid: the kernel
// arguments, unit A (W13 + SwiGLU of one (tile, route), h to intermediate) and the route
// combine. Needs nothing but cuda_fp16.h (NVRTC compiles it for the sm_70 gate).

#pragma once

#include "awq_moe_m1_math.cuh"

namespace qpn {

// A unit A's loads in flight per warp, in groups (512 B of codes + metadata each). A V100 needs
// only ~5-7 KB in flight per SM to cover its memory latency at ~850 GB/s (the V100 design's one
// CTA of 10 warps x 3 groups x 512 B = 15 KB); sm_80+ issues all of a warp's loads at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kMaxDepthA = 3;
#else
constexpr int kMaxDepthA = kGroups13;
#endif

struct MoeArgs {
  __half* out;           // (1, 2560) fp16, written completely
  __half* intermediate;  // (10, 160) fp16, written completely
  const __half* x;       // (1, 2560) fp16
  const unsigned* w13;   // (E, 2560, 40) int32 words, tiled (contract section 3)
  const void* s13;       // (E, 80, 320) int32 records or (E, 80, 320, 3) uint8
  const unsigned* w2;    // (E, 160, 320) int32 words, tiled
  const void* s2;        // (E, 5, 2560) int32 records or (E, 5, 2560, 3) uint8
  const int* ids;        // (1, 10) int32, router order; outside [0, E) = no contribution
  const float* weights;  // (1, 10) fp32 router weights
  int num_experts;       // E, the banks' leading dimension
#ifdef QPN_TRACE
  // Traced build only (bench op --trace): (CTAs, kTraceStamps) uint64 %globaltimer stamps.
  unsigned long long* trace;
  int trace_skip_barrier;  // 1: no grid barrier (h is then racy: timing only)
#endif
};

// ---------------------------------------------------------------------------------------------
// SwiGLU at the end of a unit A.

// g / d for d = 1 + exp(-g) >= 1, |g| <= 65504 (an FP16 value): the IEEE quotient, bit for bit.
// This is the instruction sequence the compiler emits for an FP32 division (a reciprocal, one
// Newton step, the quotient and one correction), which is correctly rounded wherever FCHK
// passes; ptxas's division calls its slow path behind that check, and on sm_70 a CALL waits on
// every scoreboard in flight, i.e. on W2's loads (tests/kernels/test_sm70_scoreboard.py).
// Here the slow path (the plain division) is taken only where the operands leave the range in
// which the sequence is exact: d not below 2^64 (exp overflow) or g zero or subnormal.
__device__ __forceinline__ float silu_quotient(float g, float d) {
  const float ag = fabsf(g);
  if (d < 1.8446744e19f && ag >= 1.17549435e-38f) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d));
    const float e = fmaf(-d, y, 1.0f);
    y = fmaf(y, e, y);
    const float q = fmaf(g, y, 0.0f);
    const float r = fmaf(-d, q, g);
    return fmaf(y, r, q);
  }
  return g / d;
}

// The 16 values of h of a unit A, in lanes 0..15 of the calling warp: the kParts FP32 partials
// of the tile's 16 gate and 16 up columns summed in ascending order (a fixed order), rounded,
// SwiGLU. Lanes 16..31 return 0.
template <int kParts>
__device__ __forceinline__ __half swiglu_h(const float* part, int lane) {
  __half h = __float2half_rn(0.0f);
  if (lane < kTile / 2) {
    float gate = 0.0f, up = 0.0f;
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      gate += part[p * kTile + 2 * lane];
      up += part[p * kTile + 2 * lane + 1];
    }
    const __half gate16 = __float2half_rn(gate);
    const __half up16 = __float2half_rn(up);
    const float g = __half2float(gate16);
    const __half silu16 = __float2half_rn(silu_quotient(g, 1.0f + expf(-g)));
    h = __hmul(silu16, up16);
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Unit A: W13 + SwiGLU for one (tile, route): 16 values of intermediate[route]. kWarpsA warps
// (dividing the 80 groups) split K; their FP32 partials meet in shared memory in warp order.
// An invalid expert's h is zeroed. It does not prefetch W2: 7.68 MB would not stay in a V100's
// 6 MB L2.
//
// Critical path: x is loaded before ids (it does not depend on them) and only stored to shared
// memory after the weight loads are issued, so the weight stream starts one round trip after
// the kernel starts, not two.
template <bool kMeta3, int kWarpsA>
__device__ __forceinline__ void w13_swiglu_unit(const MoeArgs& a, int tile, int route) {
  constexpr int kG = kGroups13 / kWarpsA;
  constexpr int kDepth = kG < kMaxDepthA ? kG : kMaxDepthA;
  constexpr int kParts = WarpAcc::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  constexpr int kXChunks = kG * 4;  // 16 B chunks of x in this warp's k slice
  constexpr int kXPerLane = (kXChunks + 31) / 32;
  __shared__ float part[kWarpsA * kParts * kTile];
  __shared__ uint4 xs[kWarpsA][kXChunks];
  __shared__ __align__(16) __half hs[kTile / 2];

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g0 = warp * kG;
  uint4 xr[kXPerLane];
#pragma unroll
  for (int j = 0; j < kXPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < kXChunks) xr[j] = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + i);
  }
  const int e = a.ids[route];
  __half* h_out = a.intermediate + route * kInter + tile * (kTile / 2);
  if (!route_is_valid(e, a.num_experts)) {
    if (threadIdx.x < kTile / 2) h_out[threadIdx.x] = __float2half_rn(0.0f);
    return;
  }
  const LaneMap lm(lane);
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
  __syncwarp();

  WarpAcc acc;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    dot_group<kMeta3>(acc, ring[g % kDepth], xs[warp][4 * g + lm.kq]);
    if (g + kDepth < kG) load_group(ring[g % kDepth], codes, meta, kMetaGroupBytes, g + kDepth, lm);
  }
  store_partials(acc, part + warp * kParts * kTile, lane);
  __syncthreads();

  if (warp == 0) {
    const __half h = swiglu_h<kWarpsA * kParts>(part, lane);
    if (lane < kTile / 2) hs[lane] = h;
    __syncwarp();
    // 16 values = 32 B: two 16 B stores.
    if (lane < 2) reinterpret_cast<uint4*>(h_out)[lane] = reinterpret_cast<const uint4*>(hs)[lane];
  }
}

// The end of a W2 tile: threads 0 .. kCols - 1 combine the routes' y (FP16 values in FP32,
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

}  // namespace qpn
