// What every form of the AWQ M1 operator's kernels shares: the launch geometry, the kernel
// arguments, the tuning-diagnostic bits, timeline stamps for tracing builds and SwiGLU. The
// forms are in awq_moe_m1_two_kernel.cuh and awq_moe_m1_split.cuh (awq_moe_m1_kernels.cuh
// includes them all). Needs nothing but cuda_fp16.h (NVRTC compiles it for the sm_70 gate).

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

// The two-kernel form's polled hand-off of h (sm_90 with PDL, the default there): kernel A
// publishes each pair of h values with the call's tag in one 64-bit word; kernel B polls the
// words of h it needs until every one carries the tag, so h reaches it one L2 round trip after
// the store instead of after kernel A's completion. The tag is epoch + 1; the call's last unit B
// past its polls stores that as the new epoch. Each 64-bit word is one single-copy-atomic access,
// so a word with the tag holds this call's values. Module scope like the split form's shares:
// calls on one device must not run concurrently.
struct PolledH {
  unsigned long long words[kRoutes][kInter / 2];  // (tag << 32) | h[2j + 1] << 16 | h[2j]
  unsigned epoch;    // the tag of the last completed call
  unsigned arrived;  // units B of this call counted in
};

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
  PolledH* polled;             // two-kernel form, polled hand-off: g_polled_h
  int num_experts;             // E, the banks' leading dimension
  int diag;                    // tuning diagnostics, 0 in normal calls (kDiag* bits)
  int b_delay_ns;              // tuning runs: kernel B holds its W2 loads back this long
};

// kDiagLaunchOnly: both kernels stop right after reading ids (measures launch + ids latency).
constexpr int kDiagLaunchOnly = 1;
// kDiagNoW2Prefetch: kernel A does not prefetch the routes' W2 into L2 (tuning comparisons).
constexpr int kDiagNoW2Prefetch = 2;

// Relaxed (gpu scope) accesses for the hand-offs between the CTAs of one call.
__device__ __forceinline__ unsigned load_relaxed_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ ulonglong2 load_relaxed_gpu(const unsigned long long* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(v.x), "=l"(v.y)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed_gpu(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void store_relaxed_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// %globaltimer, ns (tuning delays and trace stamps).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Timeline stamps, in tracing builds only (-DQPN_TRACE, `scripts/op_trace.py`): thread 0 of every
// CTA writes %globaltimer at up to 16 points of the call, slot = route * 10 + tile for units A,
// 100 + tile for units B, and after them its SM's index + 1 (which units share an SM); each call
// overwrites the previous one's. Slots: 100 units A, then up to 160 units B (the 16-column
// kernel B).

constexpr int kTraceSlots = 272;
constexpr int kTraceStamps = 16;
// The stamps, the SM, then the SM's cycle counter at each stamp (so that a slow interval can be
// told apart from a slow clock).
constexpr int kTraceColumns = 2 * kTraceStamps + 1;
#ifdef QPN_TRACE
// Stamps go to shared memory first and to g_trace once, at the unit's end (trace_flush): a
// global store per stamp would queue behind the weight stream and delay what follows it.
__device__ unsigned long long g_trace[kTraceSlots][kTraceColumns];
__shared__ unsigned long long s_trace[kTraceStamps];
__shared__ unsigned long long s_clock[kTraceStamps];
__device__ __forceinline__ void trace_stamp(int, int k) {
  if (threadIdx.x == 0) {
    unsigned long long t, c;
    asm volatile("mov.u64 %0, %%globaltimer;\n\tmov.u64 %1, %%clock64;" : "=l"(t), "=l"(c));
    if (k == 0) {
#pragma unroll
      for (int i = 1; i < kTraceStamps; ++i) s_trace[i] = 0;
    }
    s_trace[k] = t;
    s_clock[k] = c;
  }
}
// A stamp taken only once `dep` is computed (an operand of the timer read), so that it marks
// when that value (say an accumulator that needs a group's loads) was ready.
__device__ __forceinline__ void trace_stamp_after(int, int k, float dep) {
  if (threadIdx.x == 0) {
    unsigned long long t, c;
    asm volatile("mov.u64 %0, %%globaltimer;\n\tmov.u64 %1, %%clock64; // %2"
                 : "=l"(t), "=l"(c)
                 : "f"(dep));
    s_trace[k] = t;
    s_clock[k] = c;
  }
}
__device__ __forceinline__ void trace_flush(int slot) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kTraceStamps; ++i) {
      g_trace[slot][i] = s_trace[i];
      g_trace[slot][kTraceStamps + 1 + i] = s_clock[i];
    }
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_trace[slot][kTraceStamps] = sm + 1ull;
  }
}
#else
__device__ __forceinline__ void trace_stamp(int, int) {}
__device__ __forceinline__ void trace_stamp_after(int, int, float) {}
__device__ __forceinline__ void trace_flush(int) {}
#endif

// ---------------------------------------------------------------------------------------------
// The start of a unit A (both forms): its timeline slot, its route's expert and its 16 values of
// intermediate[route]. An invalid expert's h is zeroed here and the caller returns.
struct UnitRoute {
  int slot;
  int expert;
  __half* h_out;
  bool valid;
};

__device__ __forceinline__ UnitRoute unit_route(const MoeArgs& a, int tile, int route) {
  const int slot = route * kTiles13 + tile;
  trace_stamp(slot, 0);
  const int e = a.ids[route];
  __half* h_out = a.intermediate + route * kInter + tile * (kTile / 2);
  const bool valid = route_is_valid(e, a.num_experts);
  if (!valid) {
    if (threadIdx.x < kTile / 2) h_out[threadIdx.x] = __float2half_rn(0.0f);
  } else {
    trace_stamp(slot, 1);  // ids known
  }
  return UnitRoute{slot, e, h_out, valid};
}

// ---------------------------------------------------------------------------------------------
// SwiGLU at the end of a unit A (both forms).

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
      if (p == 0) trace_stamp_after(0, 5, gate + up);  // warp 0's first partial in
    }
    trace_stamp_after(0, 7, gate + up);  // warp 0's sums done
    const __half gate16 = __float2half_rn(gate);
    const __half up16 = __float2half_rn(up);
    const float g = __half2float(gate16);
    const __half silu16 = __float2half_rn(g / (1.0f + expf(-g)));
    h = __hmul(silu16, up16);
    trace_stamp_after(0, 8, __half2float(h));  // SwiGLU done
  }
  return h;
}

// The end of a unit A, on warp 0: lanes 0..15's h to hs (shared) and h_out.
__device__ __forceinline__ void store_h(__half h, __half* hs, __half* h_out, int lane) {
  if (lane < kTile / 2) hs[lane] = h;
  __syncwarp();
  trace_stamp(0, 9);
  // 16 values = 32 B: two 16 B stores.
  if (lane < 2) reinterpret_cast<uint4*>(h_out)[lane] = reinterpret_cast<const uint4*>(hs)[lane];
}

template <int kParts, bool kRolled = false>
__device__ __forceinline__ void swiglu_store(const float* part, __half* hs, __half* h_out, int lane) {
  store_h(swiglu_h<kParts, kRolled>(part, lane), hs, h_out, lane);
}

}  // namespace qpn
