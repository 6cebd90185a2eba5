// Kernels of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator.
// The per-warp arithmetic (decode, tensor-core steps) is in awq_moe_m1_math.cuh; the torch
// binding in awq_moe_m1_cuda.cu; the contract (bank layout, staged roundings) in
// docs/contract.md sections 3-4. Like the math header, this one needs nothing but cuda_fp16.h
// (NVRTC compiles it for the sm_70 CI gate).
//
// Three forms, no atomics, every reduction in a fixed order:
//
// Split form (sm_90 default, PATH_AUTO with PDL):
//   kernel A  grid (10 W13 column tiles, 10 routes), 16 warps: the unit (tile, route) streams
//             its W13 tile (32 columns = 16 values of h) and the 16 rows of W2 those values
//             multiply, all at once; SwiGLU; then that slice's FP32 share of y_route for all
//             2560 columns, to a module buffer (g_y_part).
//   kernel C  grid (80 output tiles): per (route, column) the 10 shares in tile order, y_route
//             rounded to FP16, the routes combined in router order.
// Two-kernel form (sm_70 and sm_80-89; the V100 route):
//   kernel A  grid (10 W13 column tiles, 10 routes), 8 or 16 warps: each warp streams kG groups
//             (32 k x 32 columns, 512 B of codes + metadata each) of one tile of one routed
//             expert, then prefetches its share of the route's W2 into L2; the warps' FP32
//             partials meet in shared memory in warp order; 16 threads apply SwiGLU and write
//             16 values of intermediate[route].
//   kernel B  grid (80 W2 column tiles), one warp per route: each warp loads its 5 groups of
//             W2 (independent of h) and, under PDL on sm_90, dequantizes them while it waits
//             for kernel A; then dots them with h, rounds y_route to FP16; 32 threads combine
//             the routes in router order.
// Fused single launch (sm_80+, per-route counters instead of the kernel boundary), at the end;
// tested but slower on the H200 (docs/performance.md section 4).

#pragma once

#include "awq_moe_m1_math.cuh"

namespace qpn {

// Kernel A geometry: 100 CTAs of warps_a() warps; each warp owns kGroups13 / warps_a() groups.
// The m8n8k4 (V100) configuration uses 8 warps: its 32 accumulator registers per lane would
// spill under the 64-register cap that two 512-thread CTAs per SM impose, and V100 needs two
// CTAs per SM (100 CTAs on 80 SMs) to run kernel A in one wave. sm_80+ uses 16 warps.
__host__ __device__ constexpr int warps_a(bool mma884) { return mma884 ? 8 : 16; }
constexpr int kWarpsB = kRoutes;
// Kernel A's loads in flight per warp, in groups (512 B of codes + metadata each). V100 needs
// only ~5-7 KB in flight per SM to cover its memory latency at ~850 GB/s (2 CTAs x 256 threads x
// 3 groups x 32 B = 48 KB here); sm_80+ issues all of a warp's loads at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kMaxDepthA = 3;
#define QPN_A_MIN_BLOCKS 2
#else
constexpr int kMaxDepthA = kGroups13;
#define QPN_A_MIN_BLOCKS 1
#endif

struct MoeArgs {
  __half* out;                 // (1, 2560) fp16, written completely
  __half* intermediate;        // (10, 160) fp16, written completely
  const __half* x;             // (1, 2560) fp16
  const unsigned* w13;         // (E, 2560, 40) int32 words, tiled (contract section 3)
  const void* s13;             // (E, 80, 320) int32 records or (E, 80, 320, 3) uint8
  const unsigned* w2;          // (E, 160, 320) int32 words, tiled
  const void* s2;              // (E, 5, 2560) int32 records or (E, 5, 2560, 3) uint8
  const int* ids;              // (1, 10) int32, router order; outside [0, E) = no contribution
  const float* weights;        // (1, 10) fp32 router weights
  float* y_part;               // split form: (10, 10, 2560) FP32 shares of y, g_y_part
  int num_experts;             // E, the banks' leading dimension
  int diag;                    // tuning diagnostics, 0 in normal calls (kDiag* bits)
  int b_delay_ns;              // tuning runs: kernel B holds its W2 loads back this long
};

// kDiagLaunchOnly: both kernels stop right after reading ids (measures launch + ids latency).
constexpr int kDiagLaunchOnly = 1;
// kDiagNoW2Prefetch: kernel A does not prefetch the routes' W2 into L2 (tuning comparisons).
constexpr int kDiagNoW2Prefetch = 2;

// %globaltimer, ns (tuning delays and trace stamps).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Timeline stamps, in tracing builds only (-DQPN_TRACE, `scripts/op_trace.py`): thread 0 of every
// CTA writes %globaltimer at up to 16 points of the call, slot = route * 10 + tile for units A,
// 100 + tile for units B; each call overwrites the previous one's.

constexpr int kTraceSlots = 256;
constexpr int kTraceStamps = 16;
#ifdef QPN_TRACE
// Stamps go to shared memory first and to g_trace once, at the unit's end (trace_flush): a
// global store per stamp would queue behind the weight stream and delay what follows it.
__device__ unsigned long long g_trace[kTraceSlots][kTraceStamps];
__shared__ unsigned long long s_trace[kTraceStamps];
__device__ __forceinline__ void trace_stamp(int, int k) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (k == 0) {
#pragma unroll
      for (int i = 1; i < kTraceStamps; ++i) s_trace[i] = 0;
    }
    s_trace[k] = t;
  }
}
// A stamp taken only once `dep` is computed (an operand of the timer read), so that it marks
// when that value (say an accumulator that needs a group's loads) was ready.
__device__ __forceinline__ void trace_stamp_after(int, int k, float dep) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer; // %1" : "=l"(t) : "f"(dep));
    s_trace[k] = t;
  }
}
__device__ __forceinline__ void trace_flush(int slot) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kTraceStamps; ++i) g_trace[slot][i] = s_trace[i];
  }
}
#else
__device__ __forceinline__ void trace_stamp(int, int) {}
__device__ __forceinline__ void trace_stamp_after(int, int, float) {}
__device__ __forceinline__ void trace_flush(int) {}
#endif

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

__device__ __forceinline__ unsigned load_relaxed_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
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

// Kernel A's CTA (tile, route) prefetches tile/10 of the route's W2 (codes and metadata, each
// contiguous per expert) into L2 right after issuing its W13 loads, so W2 streams from HBM while
// W13 is computed and kernel B's loads hit L2 whether or not its CTAs were resident early.
// One 128 B line per thread: 160 lines of codes, then 40 (4-byte) or 30 (3-byte) of metadata.
template <bool kMeta3>
__device__ __forceinline__ void prefetch_w2_share(const MoeArgs& a, int e, int tile) {
  constexpr int kLine = 128;
  constexpr int kCodeBytes = kWords2 * 4 / kTiles13;                      // 20480
  constexpr int kMetaBytes = kGroups2 * kHidden * (kMeta3 ? 3 : 4) / kTiles13;  // 5120 or 3840
  constexpr int kCodeLines = kCodeBytes / kLine;
  constexpr int kLines = kCodeLines + (kMetaBytes + kLine - 1) / kLine;
  const int i = threadIdx.x;
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
// The split form (sm_80+, the default with PDL on sm_90): unit A also owns W2's rows
// 16 tile .. 16 tile + 15, the rows its 16 values of h multiply. It loads them with its W13
// share, before h exists, and writes that slice's FP32 share of y_route for all 2560 columns
// here; kernel C sums the 10 shares of each (route, column) in tile order, rounds y_route to
// FP16 and combines the routes. So the whole weight stream is in flight from the start and only
// 1 MB of FP32 partials (in L2) crosses the kernel boundary. Like g_fused_sync, module scope:
// calls on one device must not run concurrently (the route makes one call per MoE layer on the
// model's stream). The kernels take its address from their arguments (MoeArgs::y_part, set by
// the launcher): reading a __device__ symbol's address costs a constant-cache miss, one L2
// round trip, at the first use, which would sit right on the critical path after the waits.

__device__ float g_y_part[kRoutes][kTiles13][kHidden];

// The 16 values of h of a unit A, in lanes 0..15 of the calling warp: the kParts FP32 partials
// of the tile's 16 gate and 16 up columns summed in ascending order (a fixed order), rounded,
// SwiGLU. Lanes 16..31 return 0.
template <int kParts, bool kRolled = false>
__device__ __forceinline__ __half swiglu_h(const float* part, int lane) {
  __half h = __float2half_rn(0.0f);
  if (lane < kTile / 2) {
    float gate = 0.0f, up = 0.0f;
#pragma unroll(kRolled ? 1 : kParts)
    for (int p = 0; p < kParts; ++p) {
      gate += part[p * kTile + 2 * lane];
      up += part[p * kTile + 2 * lane + 1];
    }
    trace_stamp(0, 7);
    const __half gate16 = __float2half_rn(gate);
    const __half up16 = __float2half_rn(up);
    const float g = __half2float(gate16);
    const __half silu16 = __float2half_rn(g / (1.0f + expf(-g)));
    h = __hmul(silu16, up16);
    trace_stamp(0, 8);
  }
  return h;
}

// The end of a unit A, on warp 0: h to hs (shared) and h_out.
template <int kParts, bool kRolled = false>
__device__ __forceinline__ void swiglu_store(const float* part, __half* hs, __half* h_out, int lane) {
  const __half h = swiglu_h<kParts, kRolled>(part, lane);
  if (lane < kTile / 2) hs[lane] = h;
  __syncwarp();
  trace_stamp(0, 9);
  // 16 values = 32 B: two 16 B stores.
  if (lane < 2) reinterpret_cast<uint4*>(h_out)[lane] = reinterpret_cast<const uint4*>(hs)[lane];
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
template <bool kMeta3, bool kMma884, int kWarpsA, bool kSignal, bool kLoadOnly = false>
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

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g0 = warp * kG;
  uint4 xr[kXPerLane];
#pragma unroll
  for (int j = 0; j < kXPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < kXChunks) xr[j] = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + i);
  }
  const int slot = route * kTiles13 + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  __half* h_out = a.intermediate + route * kInter + tile * (kTile / 2);
  if (!route_is_valid(e, a.num_experts)) {
    if (threadIdx.x < kTile / 2) h_out[threadIdx.x] = __float2half_rn(0.0f);
    if (kSignal && warp == 0) signal_h_ready(route, lane);
    return;
  }
  trace_stamp(slot, 1);  // ids known
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
  if (!kSignal && (a.diag & kDiagNoW2Prefetch) == 0) prefetch_w2_share<kMeta3>(a, e, tile);
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
  __syncthreads();
  trace_stamp(slot, 2);  // every warp's dot products done

  if (warp == 0) {
    swiglu_store<kWarpsA * kParts>(part, hs, h_out, lane);
    trace_stamp(slot, 3);  // h stored
    trace_flush(slot);
    if (kSignal) signal_h_ready(route, lane);
  }
}

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
  const int slot = route * kTiles13 + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  __half* h_out = a.intermediate + route * kInter + tile * (kTile / 2);
  if (!route_is_valid(e, a.num_experts)) {
    if (threadIdx.x < kTile / 2) h_out[threadIdx.x] = __float2half_rn(0.0f);
    return;  // kernel C skips the route: its shares are never read
  }
  trace_stamp(slot, 1);  // ids known
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
  trace_stamp_after(slot, 15, __uint_as_float(w2q[0].w[0][0] ^ sink));  // warp 0's W2 decoded
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
// kDelayW2 (tuning runs, the staged two-kernel form): hold the W2 loads back a.b_delay_ns after
// the CTA starts, so that kernel A's W13 is served first and h can be published while W2 still
// streams.
template <bool kMeta3, bool kMma884, int kPreDequant = 0, bool kDelayW2 = false,
          typename WaitForH>
__device__ __forceinline__ void w2_combine_unit(const MoeArgs& a, int tile, WaitForH wait_for_h) {
  constexpr int kG = kGroups2;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kWarpsB * kParts * kTile];
  __shared__ float ys[kRoutes * kTile];
  __shared__ float wts[kRoutes];
  __shared__ int valid_s[kRoutes];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = kTiles13 * kRoutes + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  const float weight = a.weights[route];  // read now: the combine at the end then waits for nothing
  const bool valid = route_is_valid(e, a.num_experts);
  const LaneMap<kMma884> lm(lane);
  GroupFrag<kMeta3> f[kG];
  if constexpr (kDelayW2) {
    const unsigned long long until = global_ns() + static_cast<unsigned>(a.b_delay_ns);
    while (global_ns() < until) __nanosleep(64);
  }
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
  wait_for_h(route);
  trace_stamp(slot, 2);  // h may be read

  if (valid) {
    // h_r was written by other CTAs (this launch or the previous one): read it from L2, straight
    // into the registers that hold the lane's k slice of each group.
    const uint4* h4 = reinterpret_cast<const uint4*>(a.intermediate + route * kInter);
    uint4 hv[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) hv[g] = __ldcg(h4 + 4 * g + lm.kq);
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
    ys[route * kTile + lane] = __half2float(__float2half_rn(y));
  }
  __syncthreads();

  if (threadIdx.x < kTile) {
    const int c = threadIdx.x;
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) {
      // Invalid routes contribute exactly zero (skipped, so a NaN weight there cannot leak).
      if (valid_s[r]) acc = fmaf(wts[r], ys[r * kTile + c], acc);
    }
    a.out[tile * kTile + c] = __float2half_rn(acc);
  }
  trace_stamp(slot, 3);  // out stored
  trace_flush(slot);
}

// ---------------------------------------------------------------------------------------------
// Two-kernel form (every arch): kernel A then kernel B. On sm_90 both are programmatic
// dependents: A's CTAs are resident when the previous kernel ends, B's W2 loads overlap A.

// Kernel A: grid (kTiles13, kRoutes), kWarpsA * 32 threads. kWarpsA other than warps_a() exists
// for tuning runs. kMinBlocks 2 (at most 64 registers, no spills) is the sm_90 PDL form's kernel
// A, beside w2_combine_capped_kernel.
template <bool kMeta3, bool kMma884, int kWarpsA = warps_a(kMma884), bool kLoadOnly = false,
          int kMinBlocks = QPN_A_MIN_BLOCKS>
__global__ void __launch_bounds__(kWarpsA * 32, kMinBlocks) w13_swiglu_kernel(MoeArgs a) {
  // The previous kernel (the router) writes ids and x: wait for it before reading them.
  pdl_wait_primary();
  // Kernel B only prefetches weights before waiting for us; let it be scheduled at once.
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  w13_swiglu_unit<kMeta3, kMma884, kWarpsA, false, kLoadOnly>(a, blockIdx.x, blockIdx.y);
}

// Kernel B: grid (kTiles2), kWarpsB * 32 threads.
template <bool kMeta3, bool kMma884, int kPreDequant = 0, bool kDelayW2 = false>
__device__ __forceinline__ void w2_combine_body(const MoeArgs& a) {
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[threadIdx.x >> 5] == -12345) a.out[0] = __float2half_rn(0.0f);
    return;
  }
  w2_combine_unit<kMeta3, kMma884, kPreDequant, kDelayW2>(a, blockIdx.x, [](int) {
    // The next layer's kernels may be scheduled now; they wait for our completion themselves.
    pdl_launch_dependents();
    pdl_wait_primary();  // kernel A's intermediate is complete and visible after this
  });
}

template <bool kMeta3, bool kMma884, int kPreDequant = 0>
__global__ void __launch_bounds__(kWarpsB * 32) w2_combine_kernel(MoeArgs a) {
  w2_combine_body<kMeta3, kMma884, kPreDequant>(a);
}

// Kernel B of the two-kernel form with PDL on sm_90 (m16n8k16): at most 80 registers, 3 of its 5
// groups dequantized while it waits. Each quarter of an SM's register file (16384, one per warp
// scheduler) then holds kernel A's 4 warps at 64 registers (kernel A with kMinBlocks 2) beside 3
// warps of this kernel, so all 80 B CTAs are resident from the start, issuing their W2 loads
// behind kernel A's W13 loads. With all 5 groups dequantized (94 registers) 16 of them waited
// for kernel A's CTAs to retire (H200, docs/performance.md section 4). Compilers without
// __maxnreg__ (before CUDA 12.4) get plain launch bounds: correct, only not co-resident.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define QPN_B_CAPPED_BOUNDS __maxnreg__(80)
#else
#define QPN_B_CAPPED_BOUNDS __launch_bounds__(kWarpsB * 32)
#endif
constexpr int kCappedPreDequant = 3;
template <bool kMeta3, bool kDelayW2 = false>
__global__ void QPN_B_CAPPED_BOUNDS w2_combine_capped_kernel(MoeArgs a) {
  w2_combine_body<kMeta3, false, kCappedPreDequant, kDelayW2>(a);
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

}  // namespace qpn
