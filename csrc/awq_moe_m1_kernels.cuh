// Device code of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator.
//
// This header includes nothing but cuda_fp16.h so that NVRTC (the sm_70 CI gate) can compile it
// without torch. The torch binding is in awq_moe_m1_cuda.cu; the contract (bank layout, staged
// roundings) is docs/ and ../shared/contract.md sections 3-4.
//
// Work split (two launches, no atomics, every reduction in a fixed order):
//   kernel A  grid (10 W13 column tiles, 10 routes), 8 or 16 warps: each warp streams kG groups
//             (32 k x 32 columns, 512 B of codes + metadata each) of one tile of one routed
//             expert; the warps' FP32 partials meet in shared memory in warp order; 16 threads
//             apply SwiGLU and write 16 values of intermediate[route].
//   kernel B  grid (80 W2 column tiles), one warp per route: each warp prefetches its 5 groups
//             of W2 (independent of h), waits for kernel A (PDL on sm_90), dots them with h,
//             rounds y_route to FP16; 32 threads combine the routes in router order.
//
// Inner product: each lane holds one 128-bit load = 4 columns x 8 consecutive k (one int32 word
// per column). The 8 codes decode with the magic-number trick into 4 exact half2 pairs, then
// one HFMA2 (q * s + b, a single FP16 rounding, as the contract demands). The FP16 x FP16
// products are exact and accumulate in FP32 on the tensor cores: mma.m8n8k4 (HMMA.884, the
// V100 instruction) on sm_70, mma.m16n8k16 on sm_80+. Every row of the A operand carries x, so
// every accumulator row holds the same (wanted) result and only the column map matters.

#pragma once

#include <cuda_fp16.h>

namespace qpn {

// Geometry of one TP4 rank of Qwen3.8 (contract section 2). E (experts) is a run-time value.
constexpr int kHidden = 2560;                   // W13 K, W2 N
constexpr int kInter = 160;                     // W2 K (intermediate per rank)
constexpr int kN13 = 2 * kInter;                // W13 N: gate_i at column 2i, up_i at 2i+1
constexpr int kRoutes = 10;                     // top-k
constexpr int kGroup = 32;                      // AWQ group along K
constexpr int kTile = 32;                       // columns per weight tile of the bank layout
constexpr int kGroups13 = kHidden / kGroup;     // 80
constexpr int kGroups2 = kInter / kGroup;       // 5
constexpr int kTiles13 = kN13 / kTile;          // 10
constexpr int kTiles2 = kHidden / kTile;        // 80
constexpr int kWords13 = kHidden * kN13 / 8;    // int32 code words per expert, W13
constexpr int kWords2 = kInter * kHidden / 8;   // int32 code words per expert, W2
constexpr int kGroupTileWords = kGroup * kTile / 8;  // 128 words = 512 B: one group x one tile

// Kernel A geometry: 100 CTAs of warps_a() warps; each warp owns kGroups13 / warps_a() groups.
// The m8n8k4 (V100) configuration uses 8 warps: its 32 accumulator registers per lane would
// spill under the 64-register cap that two 512-thread CTAs per SM impose, and V100 needs two
// CTAs per SM (100 CTAs on 80 SMs) to run kernel A in one wave. sm_80+ uses 16 warps.
__host__ __device__ constexpr int warps_a(bool mma884) { return mma884 ? 8 : 16; }
constexpr int kWarpsB = kRoutes;
// Kernel A's loads in flight per warp, in groups (512 B of codes + metadata each). V100 needs
// only ~5-7 KB in flight per SM to cover its memory latency at ~850 GB/s (2 CTAs x 256 threads x
// 3 groups x 32 B = 48 KB here); sm_80+ issues all of a warp's loads at once.
// (Capping kernel B at 64 registers on sm_80+, so that a B CTA fits beside an A CTA and its W2
// loads overlap A under PDL, was measured slower on the H200: 9.63 against 8.72 us/layer,
// with 16 B of spills; B keeps the compiler's choice.)
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
  int num_experts;             // E, the banks' leading dimension
  int diag;                    // tuning diagnostics, 0 in normal calls (kDiag* bits)
};

// kDiagLaunchOnly: both kernels stop right after reading ids (measures launch + ids latency).
constexpr int kDiagLaunchOnly = 1;

// ---------------------------------------------------------------------------------------------
// Small device helpers

__device__ __forceinline__ unsigned h2_bits(__half2 v) { return *reinterpret_cast<unsigned*>(&v); }
__device__ __forceinline__ __half2 bits_h2(unsigned v) { return *reinterpret_cast<__half2*>(&v); }

// Programmatic dependent launch (sm_90+): let kernel B be scheduled while kernel A still runs,
// and make B wait for A's completion (and its memory) only where it reads h.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Weights and metadata are read exactly once per call: streaming (evict-first) 128-bit loads.
__device__ __forceinline__ uint4 load_stream(const uint4* p) { return __ldcs(p); }
__device__ __forceinline__ unsigned load_stream(const unsigned* p) { return __ldcs(p); }

// The lane's share of one (group, 32-column tile): 4 columns x 8 k, and their metadata.
template <bool kMeta3>
struct GroupFrag {
  uint4 codes;  // word i = the 8 codes (k = 8*kq .. 8*kq+7 of the group) of column 4*col4 + i
  uint4 meta;   // kMeta3: 12 bytes = 4 records (scale lo, scale hi, zero); else 4 x (scale, bias)
};

// Lane -> (kq, col4): which 8-row slice of the group (kq) and which 4-column block (col4) it
// loads. The choice follows the MMA operand layout so that no shuffles are needed:
// m16n8k16 wants k pairs indexed by lane % 4; m8n8k4 wants the 8 lanes of a quadpair
// (lanes 4q..4q+3 and 4q+16..4q+19) on one k slice. Each warp's 32 x 16 B loads still cover
// one contiguous 512 B group tile (fully coalesced).
template <bool kMma884>
struct LaneMap {
  int kq, col4;
  __device__ __forceinline__ explicit LaneMap(int lane) {
    if (kMma884) {
      kq = (lane >> 2) & 3;
      col4 = (lane & 3) | ((lane >> 4) << 2);
    } else {
      kq = lane & 3;
      col4 = lane >> 2;
    }
  }
};

// Scale and bias of the lane's column `i` (0..3), broadcast to both halves.
template <bool kMeta3>
__device__ __forceinline__ void column_scale_bias(const uint4& m, int i, __half2& s2, __half2& b2) {
  if constexpr (kMeta3) {
    // 12 bytes, records at byte 0, 3, 6, 9: (scale lo, scale hi, zero point).
    unsigned s_bits, z;
    if (i == 0) {
      s_bits = m.x & 0xffffu;
      z = (m.x >> 16) & 0xffu;
    } else if (i == 1) {
      s_bits = __byte_perm(m.x, m.y, 0x0043) & 0xffffu;  // bytes 3, 4
      z = (m.y >> 8) & 0xffu;
    } else if (i == 2) {
      s_bits = m.y >> 16;  // bytes 6, 7
      z = m.z & 0xffu;
    } else {
      s_bits = (m.z >> 8) & 0xffffu;  // bytes 9, 10
      z = m.z >> 24;
    }
    const __half s = __ushort_as_half(static_cast<unsigned short>(s_bits));
    // bias = fp16(-z * s): z * s is exact in FP32 (4 x 11 significant bits), so this is the one
    // FP16 rounding of the 4-byte form's stored bias, bit for bit.
    const __half b = __float2half_rn(-static_cast<float>(z) * __half2float(s));
    s2 = __halves2half2(s, s);
    b2 = __halves2half2(b, b);
  } else {
    const unsigned rec = i == 0 ? m.x : i == 1 ? m.y : i == 2 ? m.z : m.w;
    s2 = bits_h2(__byte_perm(rec, 0, 0x1010));
    b2 = bits_h2(__byte_perm(rec, 0, 0x3232));
  }
}

// One word (8 codes of one column) -> 4 half2 weights in k order (k0,k1) (k2,k3) (k4,k5) (k6,k7).
// The bank stores row j in nibble [0,2,4,6,1,3,5,7].index(j), so masking the low nibble of each
// 16-bit half gives (k0,k1), the second nibble (k2,k3), and so on. OR-ing 0x6400 (1024.0) onto a
// low nibble gives 1024 + q; onto the second nibble 0x5400 (64.0, ulp 1/16) gives 64 + q; the
// subtraction is exact, and the HFMA2 is the single rounding w = fp16(q * s + b).
__device__ __forceinline__ void dequant_word(unsigned word, __half2 s2, __half2 b2, unsigned (&w)[4]) {
  const __half2 k1024 = bits_h2(0x64006400u);
  const __half2 k64 = bits_h2(0x54005400u);
  const unsigned hi = word >> 8;
  const __half2 q01 = __hsub2(bits_h2((word & 0x000f000fu) | 0x64006400u), k1024);
  const __half2 q23 = __hsub2(bits_h2((word & 0x00f000f0u) | 0x54005400u), k64);
  const __half2 q45 = __hsub2(bits_h2((hi & 0x000f000fu) | 0x64006400u), k1024);
  const __half2 q67 = __hsub2(bits_h2((hi & 0x00f000f0u) | 0x54005400u), k64);
  w[0] = h2_bits(__hfma2(q01, s2, b2));
  w[1] = h2_bits(__hfma2(q23, s2, b2));
  w[2] = h2_bits(__hfma2(q45, s2, b2));
  w[3] = h2_bits(__hfma2(q67, s2, b2));
}

// ---------------------------------------------------------------------------------------------
// Tensor-core steps. Accumulator arrays are per column block word i (0..3).

// sm_80+: D(16x8, f32) += A(16x16, f16, every row = x) * B(16x8, f16). Lane (t = lane % 4,
// n = lane / 4) supplies B[k = 2t, 2t+1][n] and B[2t+8, 2t+9][n]; we bind those slots to the
// real k (8t+0, 8t+1) and (8t+2, 8t+3) of its word (first MMA), then (8t+4..8t+7) (second), and
// feed A the same x pairs.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], unsigned xa, unsigned xb, unsigned b0,
                                             unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(xa), "r"(xa), "r"(xb), "r"(xb), "r"(b0), "r"(b1));
#else
  __trap();  // never launched below sm_80: the launcher picks the m8n8k4 path there
#endif
}

// sm_70+: per quadpair D(8x8, f32) += A(8x4, f16, every row = x) * B(4x8, f16). Each lane
// supplies 4 consecutive k of one column (its word's first or second half) and the matching x.
__device__ __forceinline__ void mma_m8n8k4(float (&d)[8], unsigned xa, unsigned xb, unsigned b0,
                                           unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(xa), "r"(xb), "r"(b0), "r"(b1));
#endif
}

// Per-lane accumulators of one warp over its groups, for the 4 column words of its block.
template <bool kMma884>
struct WarpAcc {
  static constexpr int kRegs = kMma884 ? 8 : 4;
  // Partial sums per column that leave one warp: m8n8k4 keeps one partial per quadpair (each
  // quadpair saw a different k slice); m16n8k16 reduces k inside the instruction.
  static constexpr int kParts = kMma884 ? 4 : 1;
  float d[4][kRegs];
  __device__ __forceinline__ WarpAcc() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < kRegs; ++j) d[i][j] = 0.0f;
  }
};

// Issue the streaming loads of one group (index g of the warp's slice) of one (expert, tile).
//   codes: the expert's words + tile offset, pointing at group 0 of the slice (uint4 units)
//   meta:  byte pointer to the record of (group 0 of the slice, column 0 of the tile)
//   meta_group_bytes: bytes between consecutive groups' records (N * record size)
template <bool kMeta3, bool kMma884>
__device__ __forceinline__ void load_group(GroupFrag<kMeta3>& f, const uint4* codes,
                                           const unsigned char* meta, int meta_group_bytes, int g,
                                           const LaneMap<kMma884>& lm) {
  f.codes = load_stream(codes + g * (kGroupTileWords / 4) + 8 * lm.kq + lm.col4);
  const unsigned char* m = meta + g * meta_group_bytes;
  if constexpr (kMeta3) {
    // 12 bytes at a 4-byte aligned offset (tile starts are 96 B multiples).
    const unsigned* p = reinterpret_cast<const unsigned*>(m + 12 * lm.col4);
    f.meta = make_uint4(load_stream(p), load_stream(p + 1), load_stream(p + 2), 0u);
  } else {
    f.meta = load_stream(reinterpret_cast<const uint4*>(m) + lm.col4);
  }
}

// Dot one loaded group with its activation slice act (fp16, shared memory, 32 values).
template <bool kMeta3, bool kMma884>
__device__ __forceinline__ void dot_group(WarpAcc<kMma884>& acc, const GroupFrag<kMeta3>& f,
                                          const uint4* act, const LaneMap<kMma884>& lm) {
  const uint4 xv = act[lm.kq];  // act[8kq .. 8kq + 7]
  const unsigned words[4] = {f.codes.x, f.codes.y, f.codes.z, f.codes.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 s2, b2;
    column_scale_bias<kMeta3>(f.meta, i, s2, b2);
    unsigned w[4];
    dequant_word(words[i], s2, b2, w);
    if constexpr (kMma884) {
      mma_m8n8k4(acc.d[i], xv.x, xv.y, w[0], w[1]);
      mma_m8n8k4(acc.d[i], xv.z, xv.w, w[2], w[3]);
    } else {
      mma_m16n8k16(acc.d[i], xv.x, xv.y, w[0], w[1]);
      mma_m16n8k16(acc.d[i], xv.z, xv.w, w[2], w[3]);
    }
  }
}

// A warp's kG groups, with at most kDepth groups' loads in flight (a register ring). kDepth = kG
// issues every load before the first use (H200: latency-bound, registers are plentiful);
// smaller kDepth keeps registers low enough for two CTAs per SM on V100.
template <int kG, int kDepth, bool kMeta3, bool kMma884>
__device__ __forceinline__ void stream_dot(WarpAcc<kMma884>& acc, const uint4* codes,
                                           const unsigned char* meta, int meta_group_bytes,
                                           const uint4* act, const LaneMap<kMma884>& lm) {
  GroupFrag<kMeta3> ring[kDepth];
#pragma unroll
  for (int g = 0; g < kDepth; ++g) load_group(ring[g], codes, meta, meta_group_bytes, g, lm);
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    dot_group<kMeta3, kMma884>(acc, ring[g % kDepth], act + 4 * g, lm);
    if (g + kDepth < kG) {
      load_group(ring[g % kDepth], codes, meta, meta_group_bytes, g + kDepth, lm);
    }
  }
}

// Write a warp's per-column partials to part[kParts][32] (tile column index 0..31).
// Column of accumulator j of word i: 4 * n + i, n = the MMA's column index.
template <bool kMma884>
__device__ __forceinline__ void store_partials(const WarpAcc<kMma884>& acc, float* part, int lane) {
  if constexpr (kMma884) {
    // m8n8k4 f32 accumulators: register j of lane L is column (j&1) | (L&2) | (j&4) of its
    // quadpair's 8x8 tile; rows are all equal here, so lanes 4q and 4q+2 cover all 8 columns.
    if (lane < 16 && (lane & 1) == 0) {
      const int q = lane >> 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (j & 2) continue;  // rows (j & 2) duplicate rows 0/1
          const int n = (j & 1) | (lane & 2) | (j & 4);
          part[q * kTile + 4 * n + i] = acc.d[i][j];
        }
      }
    }
  } else {
    // m16n8k16 f32 accumulators: c0, c1 = row lane/4, columns 2(lane%4), 2(lane%4)+1.
    if (lane < 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        part[4 * (2 * lane) + i] = acc.d[i][0];
        part[4 * (2 * lane + 1) + i] = acc.d[i][1];
      }
    }
  }
}

__device__ __forceinline__ bool route_is_valid(int e, int num_experts) {
  return e >= 0 && e < num_experts;
}

// ---------------------------------------------------------------------------------------------
// Unit A: W13 + SwiGLU for one (tile, route): 16 values of intermediate[route]. kWarpsA warps
// (dividing the 80 groups) split K; their FP32 partials meet in shared memory in warp order.

template <bool kMeta3, bool kMma884, int kWarpsA>
__device__ __forceinline__ void w13_swiglu_unit(const MoeArgs& a, int tile, int route) {
  constexpr int kG = kGroups13 / kWarpsA;
  constexpr int kDepthA = kG < kMaxDepthA ? kG : kMaxDepthA;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kWarpsA * kParts * kTile];
  __shared__ uint4 xs[kWarpsA][kG * 4];

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int e = a.ids[route];
  if (!route_is_valid(e, a.num_experts)) {
    if (threadIdx.x < kTile / 2) {
      a.intermediate[route * kInter + tile * (kTile / 2) + threadIdx.x] = __float2half_rn(0.0f);
    }
    return;
  }
  const int g0 = warp * kG;
  const LaneMap<kMma884> lm(lane);
  const uint4* codes = reinterpret_cast<const uint4*>(
      a.w13 + static_cast<long long>(e) * kWords13 + (tile * (kHidden / 8) + 4 * g0) * kTile);
  const unsigned char* meta =
      static_cast<const unsigned char*>(a.s13) +
      (static_cast<long long>(e) * kGroups13 * kN13 + g0 * kN13 + tile * kTile) * kRecordBytes;
  // This warp's slice of x (kG groups x 64 B) into shared memory.
  for (int i = lane; i < kG * 4; i += 32) {
    xs[warp][i] = __ldg(reinterpret_cast<const uint4*>(a.x) + g0 * 4 + i);
  }
  __syncwarp();

  WarpAcc<kMma884> acc;
  stream_dot<kG, kDepthA, kMeta3, kMma884>(acc, codes, meta, kN13 * kRecordBytes, xs[warp], lm);
  store_partials<kMma884>(acc, part + warp * kParts * kTile, lane);
  __syncthreads();

  if (threadIdx.x < kTile / 2) {
    const int i = threadIdx.x;
    float gate = 0.0f, up = 0.0f;
    // Fixed order: warps (k slices) ascending, quadpair partials ascending inside each warp.
#pragma unroll 4
    for (int p = 0; p < kWarpsA * kParts; ++p) {
      gate += part[p * kTile + 2 * i];
      up += part[p * kTile + 2 * i + 1];
    }
    const __half gate16 = __float2half_rn(gate);
    const __half up16 = __float2half_rn(up);
    const float g = __half2float(gate16);
    const __half silu16 = __float2half_rn(g / (1.0f + expf(-g)));
    a.intermediate[route * kInter + tile * (kTile / 2) + i] = __hmul(silu16, up16);
  }
}

// Unit B: W2 of all routes for one 32-column output tile, then the router-weighted sum.
// kWarpsB warps; warp r handles route r. `wait_for_h()` runs after the W2 loads are issued and
// before h is read (PDL in the two-kernel form, a counter in the fused form).
template <bool kMeta3, bool kMma884, typename WaitForH>
__device__ __forceinline__ void w2_combine_unit(const MoeArgs& a, int tile, WaitForH wait_for_h) {
  constexpr int kG = kGroups2;
  constexpr int kParts = WarpAcc<kMma884>::kParts;
  constexpr int kRecordBytes = kMeta3 ? 3 : 4;
  __shared__ float part[kWarpsB * kParts * kTile];
  __shared__ float ys[kRoutes * kTile];
  __shared__ uint4 hs[kRoutes][kInter / 8];

  const int route = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int e = a.ids[route];
  const bool valid = route_is_valid(e, a.num_experts);
  const LaneMap<kMma884> lm(lane);
  GroupFrag<kMeta3> f[kG];
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
  wait_for_h();

  if (valid) {
    // h was written by other CTAs during this launch or the previous one: read it from L2.
    if (lane < kInter / 8) {
      hs[route][lane] = __ldcg(reinterpret_cast<const uint4*>(a.intermediate + route * kInter) + lane);
    }
    __syncwarp();
    WarpAcc<kMma884> acc;
#pragma unroll
    for (int g = 0; g < kG; ++g) dot_group<kMeta3, kMma884>(acc, f[g], hs[route] + 4 * g, lm);
    store_partials<kMma884>(acc, part + route * kParts * kTile, lane);
    __syncwarp();
    // y_route = fp16(FP32 sum over k), per route; quadpair partials in ascending order.
    float y = 0.0f;
#pragma unroll
    for (int p = 0; p < kParts; ++p) y += part[(route * kParts + p) * kTile + lane];
    ys[route * kTile + lane] = __half2float(__float2half_rn(y));
  }
  __syncthreads();

  if (threadIdx.x < kTile) {
    const int c = threadIdx.x;
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) {
      // Invalid routes contribute exactly zero (skipped, so a NaN weight there cannot leak).
      if (route_is_valid(a.ids[r], a.num_experts)) acc = fmaf(a.weights[r], ys[r * kTile + c], acc);
    }
    a.out[tile * kTile + c] = __float2half_rn(acc);
  }
}

// ---------------------------------------------------------------------------------------------
// Two-kernel form (every arch): kernel A then kernel B. On sm_90 both are programmatic
// dependents: A's CTAs are resident when the previous kernel ends, B's W2 loads overlap A.

// Kernel A: grid (kTiles13, kRoutes), kWarpsA * 32 threads. kWarpsA other than warps_a() exists
// for tuning runs.
template <bool kMeta3, bool kMma884, int kWarpsA = warps_a(kMma884)>
__global__ void __launch_bounds__(kWarpsA * 32, QPN_A_MIN_BLOCKS) w13_swiglu_kernel(MoeArgs a) {
  // The previous kernel (the router) writes ids and x: wait for it before reading them.
  pdl_wait_primary();
  // Kernel B only prefetches weights before waiting for us; let it be scheduled at once.
  pdl_launch_dependents();
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[blockIdx.y] == -12345) a.intermediate[0] = __float2half_rn(0.0f);  // keep the load
    return;
  }
  w13_swiglu_unit<kMeta3, kMma884, kWarpsA>(a, blockIdx.x, blockIdx.y);
}

// Kernel B: grid (kTiles2), kWarpsB * 32 threads.
template <bool kMeta3, bool kMma884>
__global__ void __launch_bounds__(kWarpsB * 32) w2_combine_kernel(MoeArgs a) {
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[threadIdx.x >> 5] == -12345) a.out[0] = __float2half_rn(0.0f);
    return;
  }
  w2_combine_unit<kMeta3, kMma884>(a, blockIdx.x, [] {
    // The next layer's kernels may be scheduled now; they wait for our completion themselves.
    pdl_launch_dependents();
    pdl_wait_primary();  // kernel A's intermediate is complete and visible after this
  });
}

// ---------------------------------------------------------------------------------------------
// Fused form (sm_80+, used when all kFusedCtas CTAs can be resident at once, so a waiting CTA
// can never keep a producing CTA from running): one launch, CTAs [0, 100) run unit A and CTAs
// [100, 180) unit B. The B CTAs issue their W2 loads at once, then wait on a device-scope
// arrival counter for all 100 A units. One launch instead of two removes a kernel boundary
// (about 1.3 us on an H200 in a graph) and lets W2 stream in parallel with W13.
//
// The counters live in this module (no allocation per call) and are never reset: call n (n
// counted from 0 per device) waits for A arrivals to reach (n + 1) * 100; the last B CTA of a
// call advances the epoch n. Calls on one device must therefore not run concurrently (two
// streams at once); the route's calls are one per MoE layer on the model's stream.

constexpr int kFusedWarps = kWarpsB;  // 10 warps: unit A then splits K in 8-group slices
constexpr int kFusedCtasA = kTiles13 * kRoutes;
constexpr int kFusedCtas = kFusedCtasA + kTiles2;

struct FusedSync {
  unsigned epoch;       // completed fused calls on this device
  unsigned a_arrivals;  // unit A completions, all calls
  unsigned b_done;      // unit B completions, all calls
};
__device__ FusedSync g_fused_sync;

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release_gpu(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <bool kMeta3>
__global__ void __launch_bounds__(kFusedWarps * 32) fused_moe_kernel(MoeArgs a) {
  __shared__ unsigned epoch_s;
  pdl_wait_primary();  // ids, x and the previous call's counters are final after this
  pdl_launch_dependents();
  if (threadIdx.x == 0) epoch_s = load_acquire_gpu(&g_fused_sync.epoch);
  __syncthreads();
  const unsigned epoch = epoch_s;
  if (blockIdx.x < kFusedCtasA) {
    w13_swiglu_unit<kMeta3, false, kFusedWarps>(a, blockIdx.x % kTiles13, blockIdx.x / kTiles13);
    __syncthreads();  // every h store of this CTA happens before the release below
    if (threadIdx.x == 0) add_release_gpu(&g_fused_sync.a_arrivals, 1u);
    return;
  }
  w2_combine_unit<kMeta3, false>(a, blockIdx.x - kFusedCtasA, [epoch] {
    if (threadIdx.x == 0) {
      const unsigned target = (epoch + 1u) * static_cast<unsigned>(kFusedCtasA);
      // Back off between polls so 80 pollers do not crowd the line the 100 arrivals update.
      while (static_cast<int>(load_acquire_gpu(&g_fused_sync.a_arrivals) - target) < 0) {
        __nanosleep(64);
      }
    }
    __syncthreads();
  });
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(&g_fused_sync.b_done, 1u);
    if (done == (epoch + 1u) * static_cast<unsigned>(kTiles2) - 1u) {
      // Last unit B of this call: every CTA of the call has read the epoch by now.
      __threadfence();
      atomicAdd(&g_fused_sync.epoch, 1u);
    }
  }
}

}  // namespace qpn
