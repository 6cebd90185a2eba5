// The split form (PATH_SPLIT; the sm_90 default before the polled hand-off): kernel A's unit
// also multiplies the 16 rows of W2 its values of h meet, kernel C sums the shares and combines
// the routes.

#pragma once

#include "awq_moe_m1_common.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// The split form (sm_80+, pinned by PATH_SPLIT): unit A also owns W2's rows
// 16 tile .. 16 tile + 15, the rows its 16 values of h multiply. It loads them with its W13
// share, before h exists, and writes that slice's FP32 share of y_route for all 2560 columns
// here; kernel C sums the 10 shares of each (route, column) in tile order, rounds y_route to
// FP16 and combines the routes. So the whole weight stream is in flight from the start and only
// 1 MB of FP32 partials (in L2) crosses the kernel boundary. Like the fused form's counters
// (g_fused_sync), the shares live at module scope: calls on one device must not run
// concurrently (the route makes one call per MoE layer on the model's stream). The kernels take
// their address from their arguments (MoeArgs::y_part, set by the launcher): reading a
// __device__ symbol's address costs a constant-cache miss, one L2 round trip, at the first use,
// which would sit right on the critical path after the waits.

__device__ float g_y_part[kRoutes][kTiles13][kHidden];

// Split unit (tile, route): kSplitWarps warps; warp w owns W13 groups 5w .. 5w+4 (as in unit A)
// and W2 column tiles 5w .. 5w+4 of the slice. The W13 codes stream into registers (512 B per
// warp load); the metadata and the W2 slice, whose lanes would otherwise load the same bytes
// 2-4 times (128-256 B per warp load), are staged through shared memory with cp.async, each
// warp staging exactly what it reads (so a __syncwarp orders them), in two groups: the W13
// metadata first, then the W2 slice.
constexpr int kSplitWarps = 16;

// Tuning variants of the split unit (template flags; 0 is the default kernel).
//   kSplitLoadOnly: stream every byte but skip the arithmetic (times the loads and the tail's
//                   sums, barriers and stores; wrong results).
//   kSplitBare:     with kSplitLoadOnly, stop right after the loads (one word per warp out):
//                   the stream alone, for comparison with the read floor.
//   kSplitRolled:   the partial sums of h as a rolled loop.
// (Measured on the H200 and not kept, docs/evidence/fc3a1f6/experiments.md: every warp
// computing h itself and shuffling it to its MMA lanes; the W2 slice issued and decoded before
// the W13 codes; L2 sweeps of the route's strided parts.)
constexpr int kSplitLoadOnly = 1;
constexpr int kSplitRolled = 2;
constexpr int kSplitBare = 4;

template <bool kMeta3, int kFlags>
__device__ __forceinline__ void split_unit(const MoeArgs& a, int tile, int route) {
  constexpr bool kLoadOnly = (kFlags & kSplitLoadOnly) != 0;
  constexpr bool kRolled = (kFlags & kSplitRolled) != 0;
  constexpr int kG = kGroups13 / kSplitWarps;  // W13 groups per warp
  constexpr int kT2 = kTiles2 / kSplitWarps;   // W2 column tiles per warp
  constexpr int kRec = kMeta3 ? 3 : 4;
  constexpr int kRowBytes = kTile * kRec;       // one group's (or W2 tile's) records: 128 / 96 B
  constexpr int kRowChunks = kRowBytes / 16;
  constexpr int kM13Chunks = kG * kRowChunks;
  constexpr int kC2Chunks = kT2 * 16;           // 256 B of codes per W2 tile (16 k x 32 columns)
  constexpr int kM2Chunks = kT2 * kRowChunks;
  constexpr int kXChunks = kG * 4;
  static_assert(kGroups13 % kSplitWarps == 0 && kTiles2 % kSplitWarps == 0, "work split");
  static_assert(kXChunks <= 32, "one x chunk per lane");
  struct __align__(16) Stage {
    unsigned char m13[kG * kRowBytes];
    uint4 c2[kT2 * 16];
    unsigned char m2[kT2 * kRowBytes];
  };
  __shared__ Stage stage[kSplitWarps];
  __shared__ float part[kSplitWarps * kTile];
  __shared__ uint4 xs[kSplitWarps][kXChunks];
  __shared__ __align__(16) __half hs[kTile / 2];

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g0 = warp * kG;
  const int c0 = warp * kT2;
  uint4 xr = make_uint4(0u, 0u, 0u, 0u);
  if (lane < kXChunks) xr = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + lane);
  const auto [slot, e, h_out, valid] = unit_route(a, tile, route);
  if (!valid) return;  // kernel C skips the route: its shares are never read
  float* part_out = a.y_part + (route * kTiles13 + tile) * kHidden + c0 * kTile + lane;
  const LaneMap<false> lm(lane);
  const uint4* codes = reinterpret_cast<const uint4*>(
      a.w13 + static_cast<long long>(e) * kWords13 + (tile * (kHidden / 8) + 4 * g0) * kTile);
  uint4 ring[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    ring[g] = load_stream(codes + g * (kGroupTileWords / 4) + 8 * lm.kq + lm.col4);
  }

  Stage& st = stage[warp];
  const unsigned char* m13 =
      static_cast<const unsigned char*>(a.s13) +
      ((static_cast<long long>(e) * kGroups13 + g0) * kN13 + tile * kTile) * kRec;
#pragma unroll
  for (int j = lane; j < kM13Chunks; j += 32) {
    cp_async16(st.m13 + 16 * j, m13 + (j / kRowChunks) * (kN13 * kRec) + (j % kRowChunks) * 16);
  }
  cp_async_commit();
  // W2 codes of column tile c, k blocks 2 tile and 2 tile + 1: 256 contiguous bytes.
  const uint4* c2 = reinterpret_cast<const uint4*>(a.w2 + static_cast<long long>(e) * kWords2) +
                    (c0 * (kInter / 8) + 2 * tile) * (kTile / 4);
#pragma unroll
  for (int j = lane; j < kC2Chunks; j += 32) {
    cp_async16(&st.c2[j], c2 + (j / 16) * (kInter / 8) * (kTile / 4) + j % 16);
  }
  const unsigned char* m2 =
      static_cast<const unsigned char*>(a.s2) +
      ((static_cast<long long>(e) * kGroups2 + tile / 2) * kHidden + c0 * kTile) * kRec;
#pragma unroll
  for (int j = lane; j < kM2Chunks; j += 32) cp_async16(st.m2 + 16 * j, m2 + 16 * j);
  cp_async_commit();
  if (lane < kXChunks) xs[warp][lane] = xr;

  WarpAcc<false> acc;
  cp_async_wait<1>();  // this lane's W13 metadata
  __syncwarp();        // ... and every lane's
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    GroupFrag<kMeta3> f;
    f.codes = ring[g];
    f.meta = lds_records<kMeta3>(st.m13 + g * kRowBytes, lm.col4);
    if constexpr (kLoadOnly) {
      acc.d[0][0] += __uint_as_float((f.codes.x ^ f.codes.y ^ f.codes.z ^ f.codes.w ^ f.meta.x ^
                                      f.meta.y ^ f.meta.z ^ f.meta.w) & 0x3fffffffu);
    } else {
      dot_group<kMeta3, false>(acc, f, xs[warp][4 * g + lm.kq]);
    }
    trace_stamp_after(slot, 10 + g, acc.d[0][0]);  // warp 0's group g in
  }
  store_partials<false>(acc, part + warp * kTile, lane);
  trace_stamp(slot, 2);  // warp 0's W13 dot products done

  // The W2 slice: lane (g, t) takes the 4 words of columns 4g .. 4g+3 at k block t / 2.
  cp_async_wait<0>();
  __syncwarp();
  HalfWeights w2q[kT2];
  unsigned sink = 0;
#pragma unroll
  for (int i = 0; i < kT2; ++i) {
    GroupFrag<kMeta3> f;
    f.codes = st.c2[i * 16 + ((lane & 3) >> 1) * 8 + lm.col4];
    f.meta = lds_records<kMeta3>(st.m2 + i * kRowBytes, lm.col4);
    if constexpr (kLoadOnly) {
      sink ^= f.codes.x ^ f.codes.y ^ f.codes.z ^ f.codes.w ^ f.meta.x ^ f.meta.y ^ f.meta.z;
    } else {
      dequant_half<kMeta3>(w2q[i], f, lane);
    }
  }
  if constexpr (!kLoadOnly) {
    trace_stamp_after(slot, 15, __uint_as_float(w2q[0].w[0][0]));  // warp 0's W2 decoded
  }
  if constexpr (kLoadOnly && (kFlags & kSplitBare) != 0) {
    unsigned v = sink ^ __float_as_uint(acc.d[0][0]);  // every lane's loads stay live
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, m);
    if (lane == 0) part_out[0] = __uint_as_float(v & 0x3fffffffu);
    return;
  }
  __syncthreads();
  trace_stamp(slot, 3);  // every warp's dot products done, W2 decoded

  if (warp == 0) swiglu_store<kSplitWarps, kRolled>(part, hs, h_out, lane);
  trace_stamp(slot, 4);  // h stored
  __syncthreads();
  trace_stamp(slot, 5);  // h visible to every warp
  // lane (g, t): h[4t .. 4t+3], the MMA's activation operand
  const uint2 hv = reinterpret_cast<const uint2*>(hs)[lane & 3];
  // This tile's 16 values of h are W2's rows 16 tile .. 16 tile + 15: their FP32 share of
  // y_route for the warp's columns goes to the shares buffer for kernel C.
#pragma unroll
  for (int i = 0; i < kT2; ++i) {
    part_out[i * kTile] = kLoadOnly ? __uint_as_float((sink ^ hv.x) & 0x3fffffffu)
                                    : mma_half(w2q[i], hv, lane);
  }
  trace_stamp(slot, 6);  // y shares stored
  trace_flush(slot);
}

// Kernel A of the split form: grid (kTiles13, kRoutes), kSplitWarps * 32 threads.
template <bool kMeta3, int kFlags = 0>
__global__ void __launch_bounds__(kSplitWarps * 32, 1) split_a_kernel(MoeArgs a) {
  pdl_wait_primary();
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  split_unit<kMeta3, kFlags>(a, blockIdx.x, blockIdx.y);
}

// Kernel C of the split form: grid (kTiles2), kRoutes warps; warp r sums route r's 10 shares of
// its lane's column in tile order, rounds y_r to FP16; 32 threads combine the routes in router
// order.
__global__ void __launch_bounds__(kRoutes * 32) combine_split_kernel(MoeArgs a) {
  __shared__ float ys[kRoutes][kTile];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];
  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int tile = blockIdx.x;
  const int slot = kTiles13 * kRoutes + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  const float weight = a.weights[route];
  if (a.diag & kDiagLaunchOnly) {
    if (e == -12345) a.out[0] = __float2half_rn(0.0f);
    return;
  }
  const bool valid = route_is_valid(e, a.num_experts);
  if (lane == 0) {
    wts[route] = weight;
    valid_s[route] = valid;
  }
  const float* p = a.y_part + route * kTiles13 * kHidden + tile * kTile + lane;
  trace_stamp(slot, 1);
  pdl_launch_dependents();
  pdl_wait_primary();  // kernel A's shares are complete and visible after this
  trace_stamp(slot, 2);
  if (valid) {
    float share[kTiles13];
#pragma unroll
    for (int t = 0; t < kTiles13; ++t) share[t] = __ldcg(p + t * kHidden);
    float y = 0.0f;
#pragma unroll
    for (int t = 0; t < kTiles13; ++t) y += share[t];
    ys[route][lane] = __half2float(__float2half_rn(y));
  }
  trace_stamp(slot, 3);  // route 0's shares summed
  __syncthreads();
  if (threadIdx.x < kTile) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) {
      if (valid_s[r]) acc = fmaf(wts[r], ys[r][threadIdx.x], acc);
    }
    a.out[tile * kTile + threadIdx.x] = __float2half_rn(acc);
  }
  trace_stamp(slot, 4);  // out stored
  trace_flush(slot);
}

}  // namespace qpn
