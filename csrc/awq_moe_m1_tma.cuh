// Kernel A of the polled form with its W13 brought in by bulk copies (sm_90, a tuning path):
// every group's codes and records land in shared memory under their own mbarrier, so a warp
// dequantizes its groups in the order they arrive instead of the order it issued them.
//
// Why: with register loads a warp can only wait for its groups in program order, and a group
// is complete when the last of its lines arrives; the lines of a CTA's 51 KB come back in an
// order the memory system chooses, so most warps find their first group complete only near the
// end of the stream and then dequantize all five at once. Kernel A alone measured 0.8 us
// slower than the same kernel without its arithmetic (H200, scripts/op_timing.py, A-only
// against A-load-only-w13): the dequantization ran after the data, not under it.
//
// Numerics: each group's MMAs start from zero; the lane's column partials of its five groups
// are added in group order, then the warps' in warp order (a fixed order, contract section 4;
// not bit-equal to the register form, whose MMA chain runs through all five groups).

#pragma once

#include "awq_moe_m1_two_kernel.cuh"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// mbarrier and bulk-copy (TMA) steps, sm_90; never executed elsewhere (the launcher takes this
// kernel only on sm_90).

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// Arrive once and expect `bytes` more from bulk copies completing on this barrier.
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}

// Whether the barrier's phase of `parity` has completed (non-blocking; acquire, CTA scope).
__device__ __forceinline__ bool mbar_done(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
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

constexpr int kWarpsTma = 16;
template <bool kMeta3>
__host__ __device__ constexpr int tma_meta_row() {
  return kTile * (kMeta3 ? 3 : 4);
}
template <bool kMeta3>
__host__ __device__ constexpr int tma_smem_bytes() {
  return kGroups13 * (kGroupTileWords * 4 + tma_meta_row<kMeta3>() + 8);
}

template <bool kMeta3>
__device__ __forceinline__ void w13_swiglu_tma_unit(const MoeArgs& a, int tile, int route) {
  constexpr int kG = kGroups13 / kWarpsTma;  // 5
  constexpr int kCodeBytes = kGroupTileWords * 4;  // 512
  constexpr int kMetaRow = tma_meta_row<kMeta3>();
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  constexpr int kXChunks = kG * 4;
  static_assert(kXChunks <= 32, "one x chunk per lane");
  extern __shared__ __align__(128) unsigned char tma_smem[];
  unsigned char* codes_s = tma_smem;
  unsigned char* meta_s = codes_s + kGroups13 * kCodeBytes;
  auto* bars = reinterpret_cast<unsigned long long*>(meta_s + kGroups13 * kMetaRow);
  __shared__ float part[kWarpsTma * kTile];
  __shared__ uint4 xs[kWarpsTma][kXChunks];
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
  // Lanes 0..4 each bring one of the warp's groups: codes (512 contiguous bytes) and records
  // (one row of the tile's 32 columns), both completing on the group's own barrier.
  if (lane < kG) {
    const int g = g0 + lane;
    const unsigned char* codes =
        reinterpret_cast<const unsigned char*>(a.w13 + static_cast<long long>(e) * kWords13) +
        (static_cast<long long>(tile) * (kHidden / 8) + 4 * g) * kTile * 4;
    const unsigned char* meta =
        static_cast<const unsigned char*>(a.s13) +
        (static_cast<long long>(e) * kGroups13 * kN13 + static_cast<long long>(g) * kN13 +
         tile * kTile) * kRecordBytes;
    mbar_init(&bars[g], 1);
    mbar_expect_tx(&bars[g], kCodeBytes + kMetaRow);
    bulk_load(codes_s + g * kCodeBytes, codes, kCodeBytes, &bars[g]);
    bulk_load(meta_s + g * kMetaRow, meta, kMetaRow, &bars[g]);
  }
  if (threadIdx.x == 0) tag_s = epoch + 1u;
  if (lane < kXChunks) xs[warp][lane] = xr;
  __syncwarp();

  const LaneMap<false> lm(lane);
  float pc[kG];
  unsigned pending = (1u << kG) - 1u;
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
    if (took == 0u) __nanosleep(32);
  }
  float sum = pc[0];
#pragma unroll
  for (int j = 1; j < kG; ++j) sum += pc[j];
  part[warp * kTile + lane] = sum;
  trace_stamp_after(slot, 4, sum);  // warp 0's dots done
  __syncthreads();
  trace_stamp(slot, 2);  // every warp's dot products done (warp 0's arrival, see performance.md)
  if (warp == 0) {
    const __half h = swiglu_h<kWarpsTma>(part, lane);
    publish_h(a.polled, route, tile, h, tag_s, lane);
    store_h(h, hs, h_out, lane);
    trace_stamp(slot, 3);  // h stored
    trace_flush(slot);
  }
}

template <bool kMeta3>
__global__ void __launch_bounds__(kWarpsTma * 32, 2) w13_swiglu_tma_kernel(MoeArgs a) {
  pdl_wait_primary();
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  w13_swiglu_tma_unit<kMeta3>(a, blockIdx.x, blockIdx.y);
}

}  // namespace qpn
