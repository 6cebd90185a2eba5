// The arithmetic of qpnserve::awq_moe_m1_out on one warp: the bank geometry, loading a lane's
// share of a (group, 32-column tile), decoding 4-bit codes with the group's scale and bias into
// FP16 weights, and the tensor-core multiply-accumulate. Kernels and the work split are in
// awq_moe_m1_kernels.cuh and the headers it includes.
//
// Includes nothing but cuda_fp16.h so that NVRTC (the sm_70 CI gate) can compile it without
// torch.
//
// Inner product: each lane holds one 128-bit load = 4 columns x 8 consecutive k (one int32 word
// per column). The 8 codes decode with the magic-number trick into 4 exact half2 pairs, then
// one HFMA2 (q * s + b, a single FP16 rounding, as the contract demands). The FP16 x FP16
// products are exact and accumulate in FP32 on the tensor cores: mma.m8n8k4 (HMMA.884, the V100
// instruction, every row of its A operand = x), on every GPU (newer ones run it too).

#pragma once

#include <cuda_fp16.h>

#include "awq_moe_m1_geometry.h"

namespace qpn {

// ---------------------------------------------------------------------------------------------
// Small device helpers

__device__ __forceinline__ unsigned h2_bits(__half2 v) { return *reinterpret_cast<unsigned*>(&v); }
__device__ __forceinline__ __half2 bits_h2(unsigned v) { return *reinterpret_cast<__half2*>(&v); }

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
// loads. The choice follows the m8n8k4 operand layout so that no shuffles are needed: the 8
// lanes of a quadpair (lanes 4q..4q+3 and 4q+16..4q+19) sit on one k slice. Each warp's
// 32 x 16 B loads still cover one contiguous 512 B group tile (fully coalesced).
struct LaneMap {
  int kq, col4;
  __device__ __forceinline__ explicit LaneMap(int lane)
      : kq((lane >> 2) & 3), col4((lane & 3) | ((lane >> 4) << 2)) {}
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
// Two 3-byte records' zero points (one byte each, in the low byte of each half of `bits`, the
// rest masked off) as exact halves.
__device__ __forceinline__ __half2 zero_points3(unsigned bits) {
  return __hsub2(bits_h2(and_or<0x00ff00ffu, 0x64006400u>(bits)), bits_h2(0x64006400u));
}
template <>
struct ColumnMeta<true> {
  __half2 s01, s23, b01, b23;  // (column 0, column 1) and (column 2, column 3)
  __device__ __forceinline__ explicit ColumnMeta(const uint4& m) {
    s01 = bits_h2(__byte_perm(m.x, m.y, 0x4310));  // bytes 0, 1 | 3, 4
    s23 = bits_h2(__byte_perm(m.y, m.z, 0x6532));  // bytes 6, 7 | 9, 10
    const __half2 z01 = zero_points3(__byte_perm(m.x, m.y, 0x0502));  // bytes 2 | 5
    const __half2 z23 = zero_points3(__byte_perm(m.z, 0, 0x0300));    // bytes 8 | 11
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
__device__ __forceinline__ void dequant_pairs(unsigned word, __half2 s2, __half2 b2, unsigned& w01,
                                              unsigned& w23) {
  const __half2 k1024 = bits_h2(0x64006400u);
  const __half2 k64 = bits_h2(0x54005400u);
  const __half2 q01 = __hsub2(bits_h2(and_or<0x000f000fu, 0x64006400u>(word)), k1024);
  const __half2 q23 = __hsub2(bits_h2(and_or<0x00f000f0u, 0x54005400u>(word)), k64);
  w01 = h2_bits(__hfma2(q01, s2, b2));
  w23 = h2_bits(__hfma2(q23, s2, b2));
}
__device__ __forceinline__ void dequant_word(unsigned word, __half2 s2, __half2 b2, unsigned (&w)[4]) {
  dequant_pairs(word, s2, b2, w[0], w[1]);       // (k0, k1) (k2, k3)
  dequant_pairs(word >> 8, s2, b2, w[2], w[3]);  // (k4, k5) (k6, k7)
}

// ---------------------------------------------------------------------------------------------
// Tensor-core steps.

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

// Per-lane accumulators of one warp over its groups: d[i][8] per column word i; one partial per
// quadpair leaves the warp (each quadpair saw a different k slice).
struct WarpAcc {
  static constexpr int kSets = 4;
  static constexpr int kRegs = 8;
  static constexpr int kParts = 4;
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
template <bool kMeta3>
__device__ __forceinline__ void load_group(GroupFrag<kMeta3>& f, const uint4* codes,
                                           const unsigned char* meta, int meta_group_bytes, int g,
                                           const LaneMap& lm) {
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

// Calls decode(i, word, scale, bias) for the lane's 4 column words, each with its column's
// broadcast scale and bias.
template <bool kMeta3, typename Decode>
__device__ __forceinline__ void for_each_column(const GroupFrag<kMeta3>& f, Decode decode) {
  const unsigned words[4] = {f.codes.x, f.codes.y, f.codes.z, f.codes.w};
  const ColumnMeta<kMeta3> cm(f.meta);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 s2, b2;
    column_scale_bias<kMeta3>(cm, i, s2, b2);
    decode(i, words[i], s2, b2);
  }
}

template <bool kMeta3>
__device__ __forceinline__ void dequant_group(GroupWeights& q, const GroupFrag<kMeta3>& f) {
  for_each_column<kMeta3>(f, [&q](int i, unsigned word, __half2 s2, __half2 b2) {
    dequant_word(word, s2, b2, q.w[i]);
  });
}

// Multiply-accumulate dequantized weights with the lane's activation slice
// xv = act[8 kq .. 8 kq + 7] (fp16).
__device__ __forceinline__ void mma_group(WarpAcc& acc, const GroupWeights& q, const uint4& xv) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    mma_m8n8k4(acc.d[i], xv.x, xv.y, q.w[i][0], q.w[i][1]);
    mma_m8n8k4(acc.d[i], xv.z, xv.w, q.w[i][2], q.w[i][3]);
  }
}

template <bool kMeta3>
__device__ __forceinline__ void dot_group(WarpAcc& acc, const GroupFrag<kMeta3>& f,
                                          const uint4& xv) {
  GroupWeights q;
  dequant_group<kMeta3>(q, f);
  mma_group(acc, q, xv);
}

// Write a warp's per-column partials to part[kParts][32] (tile column index 0..31).
__device__ __forceinline__ void store_partials(const WarpAcc& acc, float* part, int lane) {
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
}

__device__ __forceinline__ bool route_is_valid(int e, int num_experts) {
  return e >= 0 && e < num_experts;
}

}  // namespace qpn
