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
// kDiagNoW2Prefetch: kernel A does not prefetch the routes' W2 into L2 (tuning comparisons).
constexpr int kDiagNoW2Prefetch = 2;

// ---------------------------------------------------------------------------------------------
// Timeline stamps, in tracing builds only (-DQPN_TRACE, `scripts/op_trace.py`): thread 0 of every
// CTA writes %globaltimer at 4 points of the call, slot = route * 10 + tile for units A, 100 +
// tile for units B; each call overwrites the previous one's.

constexpr int kTraceSlots = 256;
constexpr int kTraceStamps = 4;
#ifdef QPN_TRACE
__device__ unsigned long long g_trace[kTraceSlots][kTraceStamps];
__device__ __forceinline__ void trace_stamp(int slot, int k) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_trace[slot][k] = t;
  }
}
#else
__device__ __forceinline__ void trace_stamp(int, int) {}
#endif

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

// Bring one 128 B line into L2 (kept there in preference to the streamed W13 lines on sm_80+).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
#else
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

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

// (a & kMask) | kMagic as one LOP3 (truth table 0xea); written in C++, ptxas emits an AND and
// an OR, because one LOP3 takes only one immediate.
template <unsigned kMask, unsigned kMagic>
__device__ __forceinline__ unsigned and_or(unsigned a) {
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(kMask), "n"(kMagic));
  return r;
}

// The lane's metadata of one group, decoded once per group: 4 columns' scales and biases.
//   4-byte: the records themselves, (scale, bias) in the low and high half of each word.
//   3-byte: 12 bytes, records at byte 0, 3, 6, 9: (scale lo, scale hi, zero point). The bias
//           b = fp16(-z * s) of two columns at a time: z (a byte) becomes an exact half through
//           the 1024 magic number, and one HMUL2 rounds the exact product z * s once, the same
//           value as the 4-byte form's stored bias, bit for bit.
template <bool kMeta3>
struct ColumnMeta;
template <>
struct ColumnMeta<false> {
  unsigned rec[4];
  __device__ __forceinline__ explicit ColumnMeta(const uint4& m) : rec{m.x, m.y, m.z, m.w} {}
};
template <>
struct ColumnMeta<true> {
  __half2 s01, s23, b01, b23;  // (column 0, column 1) and (column 2, column 3)
  __device__ __forceinline__ explicit ColumnMeta(const uint4& m) {
    const __half2 k1024 = bits_h2(0x64006400u);
    s01 = bits_h2(__byte_perm(m.x, m.y, 0x4310));  // bytes 0, 1 | 3, 4
    s23 = bits_h2(__byte_perm(m.y, m.z, 0x6532));  // bytes 6, 7 | 9, 10
    // zero points (bytes 2 | 5 and 8 | 11) in the low byte of each half, the rest masked off
    const unsigned z01_bits = and_or<0x00ff00ffu, 0x64006400u>(__byte_perm(m.x, m.y, 0x0502));
    const unsigned z23_bits = and_or<0x00ff00ffu, 0x64006400u>(__byte_perm(m.z, 0, 0x0300));
    const __half2 z01 = __hsub2(bits_h2(z01_bits), k1024);
    const __half2 z23 = __hsub2(bits_h2(z23_bits), k1024);
    b01 = __hmul2(z01, __hneg2(s01));
    b23 = __hmul2(z23, __hneg2(s23));
  }
};

// Scale and bias of the lane's column `i` (0..3), broadcast to both halves (a broadcast half
// lets ptxas use the HFMA2 operand selectors .H0_H0 / .H1_H1 instead of a PRMT).
template <bool kMeta3>
__device__ __forceinline__ void column_scale_bias(const ColumnMeta<kMeta3>& cm, int i, __half2& s2,
                                                  __half2& b2) {
  if constexpr (kMeta3) {
    const __half2 s = i < 2 ? cm.s01 : cm.s23;
    const __half2 b = i < 2 ? cm.b01 : cm.b23;
    s2 = (i & 1) ? __high2half2(s) : __low2half2(s);
    b2 = (i & 1) ? __high2half2(b) : __low2half2(b);
  } else {
    const __half2 rec = bits_h2(cm.rec[i]);
    s2 = __low2half2(rec);
    b2 = __high2half2(rec);
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
  const __half2 q01 = __hsub2(bits_h2(and_or<0x000f000fu, 0x64006400u>(word)), k1024);
  const __half2 q23 = __hsub2(bits_h2(and_or<0x00f000f0u, 0x54005400u>(word)), k64);
  const __half2 q45 = __hsub2(bits_h2(and_or<0x000f000fu, 0x64006400u>(hi)), k1024);
  const __half2 q67 = __hsub2(bits_h2(and_or<0x00f000f0u, 0x54005400u>(hi)), k64);
  w[0] = h2_bits(__hfma2(q01, s2, b2));
  w[1] = h2_bits(__hfma2(q23, s2, b2));
  w[2] = h2_bits(__hfma2(q45, s2, b2));
  w[3] = h2_bits(__hfma2(q67, s2, b2));
}

// ---------------------------------------------------------------------------------------------
// Tensor-core steps.

// sm_80+: D(16x8, f32) += A(16x16, f16) * B(16x8, f16) with the WEIGHTS as A: row m of A is one
// output column, so one instruction covers 16 columns x 16 k (256 weights; x as A would cover
// only 8 columns, 128). Lane (g = lane / 4, t = lane % 4) supplies A rows g and g + 8 at logical
// k 2t, 2t+1, 2t+8, 2t+9 and B (x, the same in every column n) at the same logical k. We bind
// logical k (2t, 2t+1) to the real k (8t, 8t+1) of its word and (2t+8, 2t+9) to (8t+2, 8t+3)
// (first MMA), then to (8t+4 .. 8t+7) (second). Row g is column 4g + c0, row g + 8 column
// 4g + c1 of the lane's 4-column block.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                             unsigned a3, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

// Per-lane accumulators of one warp over its groups.
//   m8n8k4:   d[i][8] per column word i; one partial per quadpair leaves the warp (each quadpair
//             saw a different k slice).
//   m16n8k16: d[p][4] per column pair p (words 2p, 2p+1 -> rows g, g+8); k is reduced inside
//             the instruction, so one partial per column leaves the warp.
template <bool kMma884>
struct WarpAcc {
  static constexpr int kSets = kMma884 ? 4 : 2;
  static constexpr int kRegs = kMma884 ? 8 : 4;
  static constexpr int kParts = kMma884 ? 4 : 1;
  float d[kSets][kRegs];
  __device__ __forceinline__ WarpAcc() {
#pragma unroll
    for (int i = 0; i < kSets; ++i)
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

// One loaded group, dequantized: w[i] = the 4 half2 weights of column word i (k order).
struct GroupWeights {
  unsigned w[4][4];
};

template <bool kMeta3>
__device__ __forceinline__ void dequant_group(GroupWeights& q, const GroupFrag<kMeta3>& f) {
  const unsigned words[4] = {f.codes.x, f.codes.y, f.codes.z, f.codes.w};
  const ColumnMeta<kMeta3> cm(f.meta);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 s2, b2;
    column_scale_bias<kMeta3>(cm, i, s2, b2);
    dequant_word(words[i], s2, b2, q.w[i]);
  }
}

// Multiply-accumulate dequantized weights with the lane's activation slice
// xv = act[8 kq .. 8 kq + 7] (fp16).
template <bool kMma884>
__device__ __forceinline__ void mma_group(WarpAcc<kMma884>& acc, const GroupWeights& q,
                                          const uint4& xv) {
  if constexpr (kMma884) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mma_m8n8k4(acc.d[i], xv.x, xv.y, q.w[i][0], q.w[i][1]);
      mma_m8n8k4(acc.d[i], xv.z, xv.w, q.w[i][2], q.w[i][3]);
    }
  } else {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const unsigned(&w0)[4] = q.w[2 * p];
      const unsigned(&w1)[4] = q.w[2 * p + 1];
      mma_m16n8k16(acc.d[p], w0[0], w1[0], w0[1], w1[1], xv.x, xv.y);
      mma_m16n8k16(acc.d[p], w0[2], w1[2], w0[3], w1[3], xv.z, xv.w);
    }
  }
}

template <bool kMeta3, bool kMma884>
__device__ __forceinline__ void dot_group(WarpAcc<kMma884>& acc, const GroupFrag<kMeta3>& f,
                                          const uint4& xv) {
  GroupWeights q;
  dequant_group<kMeta3>(q, f);
  mma_group<kMma884>(acc, q, xv);
}

// Write a warp's per-column partials to part[kParts][32] (tile column index 0..31).
template <bool kMma884>
__device__ __forceinline__ void store_partials(const WarpAcc<kMma884>& acc, float* part, int lane) {
  if constexpr (kMma884) {
    // m8n8k4 f32 accumulators: register j of lane L is column (j&1) | (L&2) | (j&4) of its
    // quadpair's 8x8 tile; rows are all equal here, so lanes 4q and 4q+2 cover all 8 columns.
    // Column of accumulator j of word i: 4 * n + i, n = the MMA's column index.
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
    // m16n8k16 f32 accumulators: c0 = D[g][2t], c2 = D[g + 8][2t]; every n holds the same sum.
    // Lane (g, t) writes column 4g + t: pair t / 2, row g (c0) or g + 8 (c2) for t even / odd.
    const int t = lane & 3;
    const float(&d)[4] = acc.d[t >> 1];
    part[lane] = (t & 1) ? d[2] : d[0];
  }
}

__device__ __forceinline__ bool route_is_valid(int e, int num_experts) {
  return e >= 0 && e < num_experts;
}

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
    if (lane < kTile / 2) {
      float gate = 0.0f, up = 0.0f;
      // Fixed order: warps (k slices) ascending, quadpair partials ascending inside each warp.
#pragma unroll
      for (int p = 0; p < kWarpsA * kParts; ++p) {
        gate += part[p * kTile + 2 * lane];
        up += part[p * kTile + 2 * lane + 1];
      }
      const __half gate16 = __float2half_rn(gate);
      const __half up16 = __float2half_rn(up);
      const float g = __half2float(gate16);
      const __half silu16 = __float2half_rn(g / (1.0f + expf(-g)));
      hs[lane] = __hmul(silu16, up16);
    }
    __syncwarp();
    // 16 values = 32 B: two 16 B stores.
    if (lane < 2) reinterpret_cast<uint4*>(h_out)[lane] = reinterpret_cast<const uint4*>(hs)[lane];
    trace_stamp(slot, 3);  // h stored
    if (kSignal) signal_h_ready(route, lane);
  }
}

// Unit B: W2 of all routes for one 32-column output tile, then the router-weighted sum.
// kWarpsB warps; warp r handles route r. `wait_for_h(r)` runs after the W2 loads are issued and
// before h_r is read (PDL in the two-kernel form, the route's counter in the fused form).
// kPreDequant: dequantize W2 while waiting for h, into registers (80 per lane instead of the
// codes' 40), so that only the MMAs remain after the wait. Used where the wait is real (PDL on
// sm_90); without PDL kernel B starts after A has finished, and issuing the h loads right after
// the W2 loads (one round trip for both) is better than dequantizing in between.
// (Measured on the H200, `scripts/op_timing.py`, 4-byte, us/layer: dequant after the wait 7.17,
// before it in registers 6.85, in shared memory with kernel B capped at 64 registers so that its
// CTAs fit beside kernel A's 6.77; kernel B capped at 64 registers alone 7.00. The shared-memory
// form, traced, starts all 80 B CTAs at once but spends 1.8 us after the wait and slows kernel
// A beside it (commit 2a4857f, docs/evidence/bsmem/); it also needs 100 KB per CTA, which
// sm_86/sm_89 do not have. Not kept.)
template <bool kMeta3, bool kMma884, bool kPreDequant = false, typename WaitForH>
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
  GroupWeights q[kPreDequant ? kG : 1];
  if (kPreDequant && valid) {
#pragma unroll
    for (int g = 0; g < kG; ++g) dequant_group<kMeta3>(q[kPreDequant ? g : 0], f[g]);
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
      if constexpr (kPreDequant) {
        mma_group<kMma884>(acc, q[g], hv[g]);
      } else {
        dot_group<kMeta3, kMma884>(acc, f[g], hv[g]);
      }
    }
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
      if (valid_s[r]) acc = fmaf(wts[r], ys[r * kTile + c], acc);
    }
    a.out[tile * kTile + c] = __float2half_rn(acc);
  }
  trace_stamp(slot, 3);  // out stored
}

// ---------------------------------------------------------------------------------------------
// Two-kernel form (every arch): kernel A then kernel B. On sm_90 both are programmatic
// dependents: A's CTAs are resident when the previous kernel ends, B's W2 loads overlap A.

// Kernel A: grid (kTiles13, kRoutes), kWarpsA * 32 threads. kWarpsA other than warps_a() exists
// for tuning runs.
template <bool kMeta3, bool kMma884, int kWarpsA = warps_a(kMma884), bool kLoadOnly = false>
__global__ void __launch_bounds__(kWarpsA * 32, QPN_A_MIN_BLOCKS) w13_swiglu_kernel(MoeArgs a) {
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
template <bool kMeta3, bool kMma884, bool kPreDequant = false>
__global__ void __launch_bounds__(kWarpsB * 32) w2_combine_kernel(MoeArgs a) {
  if (a.diag & kDiagLaunchOnly) {
    if (a.ids[threadIdx.x >> 5] == -12345) a.out[0] = __float2half_rn(0.0f);
    return;
  }
  w2_combine_unit<kMeta3, kMma884, kPreDequant>(a, blockIdx.x, [](int) {
    // The next layer's kernels may be scheduled now; they wait for our completion themselves.
    pdl_launch_dependents();
    pdl_wait_primary();  // kernel A's intermediate is complete and visible after this
  });
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
