// Kernel B of the V100 path (the m8n8k4 inner product; it also runs on newer GPUs, which is how
// it is tested on an H200): W2 of all routes for one 32-column output tile and the route combine,
// started after kernel A's completion (stream order: sm_70 has no programmatic dependent launch).
// Its kernel A is w13_swiglu_kernel<kMeta3, true> (awq_moe_m1_two_kernel.cuh), which prefetches
// each route's W2 into L2 while it streams W13. The launcher runs the pair through one function,
// launch_sm70_current (awq_moe_m1_cuda.cu), so that a new V100 design can replace it whole.

#pragma once

#include "awq_moe_m1_two_kernel.cuh"

namespace qpn {

// Unit B: W2 of all routes for one 32-column output tile, then the router-weighted sum.
// kWarpsB warps; warp r handles route r: its 5 groups of W2 are loaded first (they do not depend
// on h), then h_r is read from intermediate, then the dot products.
template <bool kMeta3, bool kMma884>
__device__ __forceinline__ void w2_combine_unit(const MoeArgs& a, int tile) {
  constexpr int kG = kGroups2;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kWarpsB * kParts * kTile];
  __shared__ float ys[kRoutes * kTile];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int e = a.ids[route];
  const float weight = a.weights[route];  // read now: the combine at the end then waits for nothing
  const bool valid = route_is_valid(e, a.num_experts);
  const LaneMap<kMma884> lm(lane);
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
  // Where the launch is a programmatic dependent (never on sm_70), kernel A's intermediate is
  // complete and visible only after this; the next layer's kernels may be scheduled now.
  pdl_launch_dependents();
  pdl_wait_primary();

  if (valid) {
    // h_r was written by other CTAs: read it from L2, straight into the registers that hold the
    // lane's k slice of each group.
    const uint4* h4 = reinterpret_cast<const uint4*>(a.intermediate + route * kInter);
    uint4 hv[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) hv[g] = __ldcg(h4 + 4 * g + lm.kq);
    WarpAcc<kMma884> acc;
#pragma unroll
    for (int g = 0; g < kG; ++g) dot_group<kMeta3, kMma884>(acc, f[g], hv[g]);
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
    ys[route * kTile + lane] = __half2float(__float2half_rn(y));
  }
  __syncthreads();
  combine_routes<kTile>(ys, wts, valid_s, a.out, tile);
}

// Kernel B of the V100 path: grid (kTiles2), kWarpsB * 32 threads.
template <bool kMeta3, bool kMma884>
__global__ void __launch_bounds__(kWarpsB * 32) w2_combine_kernel(MoeArgs a) {
  w2_combine_unit<kMeta3, kMma884>(a, blockIdx.x);
}

}  // namespace qpn
