// Kernel A of the polled form with its W13 brought into shared memory by cp.async (sm_80+, a
// tuning path): every group's codes and records complete on the group's own mbarrier, so a warp
// dequantizes its groups in the order they arrive instead of the order it issued them.
//
// Why: with register loads a warp waits for its groups in program order, and a group is complete
// only when the last of its five lines arrives; the lines of a CTA's 51 KB come back in an order
// the memory system chooses, so most warps find their first group complete late and then
// dequantize several at once. Kernel A alone measured 0.8 us slower than the same kernel without
// its arithmetic (H200, scripts/op_timing.py, A-plain-only against A-load-only-w13). The ninth
// session's bulk-copy form of the same idea (commit 7811fd7) lost because its 160 small bulk
// copies per CTA landed late; cp.async uses the same load path as register loads.
//
// Each group is loaded by six lanes of its warp (7 or 6 chunks of 16 bytes each); a lane's
// cp.async.mbarrier.arrive tracks all of that lane's earlier copies, so a lane loads for one
// group only, and the group's barrier completes when its six lanes' copies have landed.
//
// Numerics: each group's MMAs start from zero; the lane's column partials of its five groups are
// added in group order, then the warps' in warp order (a fixed order, contract section 4; not
// bit-equal to the register form, whose MMA chain runs through all five groups).

#pragma once

#include "awq_moe_m1_two_kernel.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// mbarrier and cp.async steps (sm_80+; the launcher takes this kernel only on sm_90).

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  __trap();
#endif
}

// An L2 policy that marks the lines it fills evict-first (the register form's ld.global.cs).
__device__ __forceinline__ unsigned long long evict_first_policy() {
  unsigned long long policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// 16 bytes from global to shared memory (both 16-byte aligned), through L2 only.
// dst: a shared-memory address (smem_u32).
__device__ __forceinline__ void copy16_async(unsigned dst, const void* src,
                                             unsigned long long policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
               "l"(src), "l"(policy)
               : "memory");
#endif
}

// The barrier counts one arrival of this thread once all its earlier cp.async copies have
// landed (noinc: the arrival is one of the count given at init).
__device__ __forceinline__ void mbar_arrive_copies(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Whether the barrier's phase of `parity` has completed (non-blocking; acquire, CTA scope).
__device__ __forceinline__ bool mbar_done(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// ---------------------------------------------------------------------------------------------
// The unit: (tile, route) as in w13_swiglu_unit, 16 warps, warp w owning groups 5w .. 5w + 4.
// Dynamic shared memory: the tile's 80 groups of codes (512 B each), their record rows (128 or
// 96 B each) and one mbarrier per group.

constexpr int kWarpsAsync = 16;
constexpr int kLoadersAsync = 6;  // lanes loading one group
template <bool kMeta3>
__host__ __device__ constexpr int async_meta_row() {
  return kTile * (kMeta3 ? 3 : 4);
}
template <bool kMeta3>
__host__ __device__ constexpr int async_smem_bytes() {
  return kGroups13 * (kGroupTileWords * 4 + async_meta_row<kMeta3>() + 8);
}

template <bool kMeta3>
__device__ __forceinline__ void w13_swiglu_async_unit(const MoeArgs& a, int tile, int route) {
  constexpr int kG = kGroups13 / kWarpsAsync;  // 5
  constexpr int kCodeBytes = kGroupTileWords * 4;  // 512
  constexpr int kMetaRow = async_meta_row<kMeta3>();
  constexpr int kChunks = (kCodeBytes + kMetaRow) / 16;  // 40 or 38
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  constexpr int kXChunks = kG * 4;
  static_assert(kXChunks <= 32 && kG * kLoadersAsync <= 32, "one warp's lanes suffice");
  static_assert(kMetaRow % 16 == 0, "record rows are whole 16-byte chunks");
  extern __shared__ __align__(128) unsigned char async_smem[];
  unsigned char* codes_s = async_smem;
  unsigned char* meta_s = codes_s + kGroups13 * kCodeBytes;
  auto* bars = reinterpret_cast<unsigned long long*>(meta_s + kGroups13 * kMetaRow);
  __shared__ float part[kWarpsAsync * kTile];
  __shared__ uint4 xs[kWarpsAsync][kXChunks];
  __shared__ __align__(16) __half hs[kTile / 2];
  __shared__ unsigned tag_s;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g0 = warp * kG;
  uint4 xr = make_uint4(0, 0, 0, 0);
  if (lane < kXChunks) xr = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + lane);
  const auto [slot, e, h_out, valid] = unit_route(a, tile, route);
  if (!valid) {
    if (warp == 0) {
      const unsigned seen = load_relaxed_gpu(&a.polled->epoch);
      publish_h(a.polled, route, tile, __float2half_rn(0.0f), seen + 1u, lane);
    }
    return;
  }
  unsigned epoch = 0;
  if (threadIdx.x == 0) epoch = load_relaxed_gpu(&a.polled->epoch);
  if (lane < kG) mbar_init(&bars[g0 + lane], kLoadersAsync);
  __syncwarp();
  // Lane 6j + i brings chunks i, i + 6, ... of group g0 + j: the group's 32 chunks of codes (512
  // contiguous bytes), then its record row (the tile's 32 columns): chunks i + 6m, m = 0..4, are
  // codes; m = 5 is code chunk 30 + i for i < 2, else record chunk i - 2; m = 6 record chunk 4 + i.
  static_assert(kCodeBytes / 16 == 5 * kLoadersAsync + 2 && kChunks >= 36 &&
                    kChunks <= 7 * kLoadersAsync,
                "chunks 0..31 codes, 32.. records, all covered by m = 0..6");
  if (lane < kG * kLoadersAsync) {
    const int j = lane / kLoadersAsync;
    const int i = lane - j * kLoadersAsync;
    const int g = g0 + j;
    const unsigned char* codes =
        reinterpret_cast<const unsigned char*>(a.w13 + static_cast<long long>(e) * kWords13) +
        (static_cast<long long>(tile) * (kHidden / 8) + 4 * g) * kTile * 4 + 16 * i;
    const unsigned char* meta =
        static_cast<const unsigned char*>(a.s13) +
        (static_cast<long long>(e) * kGroups13 * kN13 + static_cast<long long>(g) * kN13 +
         tile * kTile) * kRecordBytes;
    const unsigned codes_dst = smem_u32(codes_s) + g * kCodeBytes + 16 * i;
    const unsigned meta_dst = smem_u32(meta_s) + g * kMetaRow;
    const unsigned long long policy = evict_first_policy();
#pragma unroll
    for (int m = 0; m < 5; ++m) {
      copy16_async(codes_dst + 16 * kLoadersAsync * m, codes + 16 * kLoadersAsync * m, policy);
    }
    const bool code5 = i < 2;
    copy16_async(code5 ? codes_dst + 16 * kLoadersAsync * 5 : meta_dst + 16 * (i - 2),
                 code5 ? codes + 16 * kLoadersAsync * 5 : meta + 16 * (i - 2), policy);
    if (36 + i < kChunks) copy16_async(meta_dst + 16 * (4 + i), meta + 16 * (4 + i), policy);
    mbar_arrive_copies(&bars[g]);
  }
  if (threadIdx.x == 0) tag_s = epoch + 1u;
  if (lane < kXChunks) xs[warp][lane] = xr;
  __syncwarp();

  const LaneMap<false> lm(lane);
  float pc[kG];
  unsigned pending = (1u << kG) - 1u;
  unsigned idle = 0;
  while (pending != 0u) {
    unsigned took = 0u;
#pragma unroll
    for (int j = 0; j < kG; ++j) {
      if ((pending >> j) & 1u) {
        const int g = g0 + j;
        if (__all_sync(0xffffffffu, mbar_done(&bars[g], 0u))) {
          GroupFrag<kMeta3> f;
          f.codes = reinterpret_cast<const uint4*>(codes_s + g * kCodeBytes)[8 * lm.kq + lm.col4];
          f.meta = lds_records<kMeta3>(meta_s + g * kMetaRow, lm.col4);
          WarpAcc<false> acc;
          dot_group<kMeta3, false>(acc, f, xs[warp][4 * j + lm.kq]);
          pc[j] = lane_column(acc, lane);
          took |= 1u << j;
        }
      }
    }
    pending &= ~took;
    if (took == 0u) {
      // A group that never lands means a broken launch: trap after about a second.
      if (++idle > (1u << 24)) __trap();
      __nanosleep(32);
    }
  }
  float sum = pc[0];
#pragma unroll
  for (int j = 1; j < kG; ++j) sum += pc[j];
  part[warp * kTile + lane] = sum;
  trace_stamp_after(slot, 4, sum);  // warp 0's dots done
  __syncthreads();
  trace_stamp(slot, 2);  // warp 0's arrival at the barrier (performance.md, "A correction")
  if (warp == 0) {
    const __half h = swiglu_h<kWarpsAsync>(part, lane);
    publish_h(a.polled, route, tile, h, tag_s, lane);
    store_h(h, hs, h_out, lane);
    trace_stamp(slot, 3);  // h stored
    trace_flush(slot);
  }
}

template <bool kMeta3>
__global__ void __launch_bounds__(kWarpsAsync * 32, 2) w13_swiglu_async_kernel(MoeArgs a) {
  pdl_wait_primary();
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  w13_swiglu_async_unit<kMeta3>(a, blockIdx.x, blockIdx.y);
}

}  // namespace qpn
