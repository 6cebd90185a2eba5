// What both forms of the AWQ M1 operator's kernels share: the launch geometry, the kernel
// arguments, the polled hand-off's state, relaxed accesses and SwiGLU. The forms are in
// awq_moe_m1_two_kernel.cuh (unit A and the sm_90 default) and awq_moe_m1_sm70.cuh (the V100
// design); awq_moe_m1_kernels.cuh includes them all. Needs nothing but cuda_fp16.h (NVRTC
// compiles it for the sm_70 gate).

#pragma once

#include "awq_moe_m1_math.cuh"

namespace qpn {

constexpr int kWarpsB = kRoutes;  // a W2 unit: one warp per route
// A unit A's loads in flight per warp, in groups (512 B of codes + metadata each). A V100 needs
// only ~5-7 KB in flight per SM to cover its memory latency at ~850 GB/s (the V100 design's one
// CTA of 10 warps x 3 groups x 512 B = 15 KB); sm_80+ issues all of a warp's loads at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kMaxDepthA = 3;
#else
constexpr int kMaxDepthA = kGroups13;
#endif

// The polled hand-off of h (the sm_90 default): kernel A publishes each pair of h values with
// the call's tag in one 64-bit word; kernel B polls the words of h it needs until every one
// carries the tag, so h reaches it one L2 round trip after the store instead of after kernel
// A's completion. The tag is epoch + 1; the call's last unit B past its polls stores that as the
// new epoch. Each 64-bit word is one single-copy-atomic access, so a word with the tag holds
// this call's values.
//
// The tag protocol is correct only while the calls that share one slot run one after another,
// so the launcher gives each stream its own slot, and each stream of each CUDA-graph capture its
// own (released with the graph); calls on one stream are ordered, and kernel A of a call waits
// for the previous call's completion before it reads the epoch. Where no slot is left, a call
// gets the shared overflow slot (index kPolledSlots), whose words nobody trusts: kernel A
// publishes there as usual (no branch, no register for it), and kernel B reads h from
// intermediate after kernel A's completion instead (MoeArgs::tagged = 0).
// Kernel B never polls for long (kMaxPolls): past that it takes the same completion path, so a
// broken slot (calls raced on it) costs time, never a hang or a trap.
// 128-byte aligned: kernel B polls the words with 16-byte loads, and every slot of the array
// then lays its rows of h and its epoch/arrival words out on 128 B lines as slot 0 does (the
// counters on a line of their own). With 16-byte slots the H200's bench op graphs, which run on
// a slot other than 0, took 0.5 us more per layer than with every call on slot 0.
struct alignas(128) PolledH {
  unsigned long long words[kRoutes][kInter / 2];  // (tag << 32) | h[2j + 1] << 16 | h[2j]
  unsigned epoch;    // the tag of the last completed call
  unsigned arrived;  // units B of this call counted in
};
static_assert(sizeof(PolledH) % 128 == 0, "every slot of an array starts 128-byte aligned");
constexpr int kPolledSlots = 64;
// A poll is one L2 round trip (0.25-0.5 us on an H200), so this is 1-2 ms, hundreds of times
// kernel A's 5 us: without the tag by then the slot is not this call's alone (or the GPU is
// shared), and waiting for kernel A's completion is no slower. A count, not a clock: a timer
// read in the loop would delay every next poll.
constexpr unsigned kMaxPolls = 1u << 12;

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
  PolledH* polled;             // sm_90 default: this call's hand-off slot, or the overflow slot
  int num_experts;             // E, the banks' leading dimension
  int tagged;                  // sm_90 default: 1 if `polled` is this call's alone
};

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

// ---------------------------------------------------------------------------------------------
// The start of a unit A: its route's expert and its 16 values of intermediate[route]. An invalid
// expert's h is zeroed here and the caller returns.
struct UnitRoute {
  int expert;
  __half* h_out;
  bool valid;
};

__device__ __forceinline__ UnitRoute unit_route(const MoeArgs& a, int tile, int route) {
  const int e = a.ids[route];
  __half* h_out = a.intermediate + route * kInter + tile * (kTile / 2);
  const bool valid = route_is_valid(e, a.num_experts);
  if (!valid && threadIdx.x < kTile / 2) h_out[threadIdx.x] = __float2half_rn(0.0f);
  return UnitRoute{e, h_out, valid};
}

// ---------------------------------------------------------------------------------------------
// SwiGLU at the end of a unit A.

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
    const __half silu16 = __float2half_rn(g / (1.0f + expf(-g)));
    h = __hmul(silu16, up16);
  }
  return h;
}

// The end of a unit A, on warp 0: lanes 0..15's h to hs (shared) and h_out.
__device__ __forceinline__ void store_h(__half h, __half* hs, __half* h_out, int lane) {
  if (lane < kTile / 2) hs[lane] = h;
  __syncwarp();
  // 16 values = 32 B: two 16 B stores.
  if (lane < 2) reinterpret_cast<uint4*>(h_out)[lane] = reinterpret_cast<const uint4*>(hs)[lane];
}

}  // namespace qpn
