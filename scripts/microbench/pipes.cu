// Which SM resource do kernel A's MMAs and its decode share? arrival.cu measured that the decode
// (LOP3, HADD2, HFMA2) and the m16n8k16 MMAs cost about twice their issue slots together, with or
// without a dependency between them, while the MMAs alone were free. This times tight loops of
// register-only work, no memory, on every SM (one CTA of `warps` warps per SM), per warp and
// iteration: the MMAs of one kernel A group (4 x mma.m16n8k16 f32, on 2 independent
// accumulators), the group's FP16 decode (16 HADD2 + 16 HFMA2), its integer decode (16 LOP3),
// and their mixes; each kind on several independent chains so that latency does not limit it.
// Then a whole group as the operator runs it (group_kernel: its decode and MMAs, dependent as in
// kernel A), and the same group with a denormal decode (no exact subtraction).
// Prints SM cycles per iteration per warp scheduler (4 per SM).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc scripts/microbench/pipes.cu -o /tmp/pipes && /tmp/pipes
//
// On the H200 (docs/evidence/375318a/pipes.log): 4 HMMA 24 cycles, the FP16 decode 40, 16 LOP3
// 32, HMMA beside the FP16 decode 79 (more than their sum), all three 89 against 52 issue slots.
// A whole group with the operator's decode 94 cycles at 16 warps, with the denormal decode 95
// (docs/evidence/79e13f3/pipes.log): a quarter fewer FP16 operations gain nothing.
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "awq_moe_m1_math.cuh"

namespace {

constexpr int kIters = 4096;
constexpr int kMma = 1, kFp16 = 2, kInt = 4;

__device__ unsigned long long g_cycles;
__device__ unsigned g_sink;

__device__ __forceinline__ void mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                    unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int kWork>
__global__ void __launch_bounds__(512, 1) loop_kernel(unsigned seed, __half2 s, __half2 b) {
  // Eight independent FP16 and integer chains, two accumulators: enough independent work that
  // each kind is limited by its pipe, not its latency.
  __half2 h[8];
  unsigned u[8];
  float d[2][4] = {};
  unsigned m[6];  // the MMAs' operands: loop-invariant, independent of the other chains
#pragma unroll
  for (int i = 0; i < 6; ++i) m[i] = 0x3c003c00u ^ (seed * (threadIdx.x + i) & 0x00ff00ffu);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    u[i] = seed * (threadIdx.x + 3 * i + 1);
    h[i] = __floats2half2_rn(1.0f + i, 2.0f - i);
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if (kWork & kMma) {
      // One operand order: the A quad and B pair stay in place (no copies).
      mma(d[0], m[0], m[1], m[2], m[3], m[4], m[5]);
      mma(d[1], m[0], m[1], m[2], m[3], m[4], m[5]);
      mma(d[0], m[0], m[1], m[2], m[3], m[4], m[5]);
      mma(d[1], m[0], m[1], m[2], m[3], m[4], m[5]);
    }
    if (kWork & kFp16) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          h[i] = __hadd2(h[i], b);      // HADD2
          h[i] = __hfma2(h[i], s, b);   // HFMA2
        }
      }
    }
    if (kWork & kInt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          unsigned v;
          asm volatile("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(u[i]), "r"(seed), "r"(u[(i + 1) & 7]));
          u[i] = v;
        }
      }
    }
  }
  const long long t1 = clock64();
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= u[i] ^ *reinterpret_cast<unsigned*>(&h[i]);
  acc ^= __float_as_uint(d[0][0] + d[1][0]);
  if (acc == 0x12345678u) g_sink = acc;
  if (threadIdx.x == 0 && blockIdx.x == 0) g_cycles = static_cast<unsigned long long>(t1 - t0);
}

// A kernel A group as the operator runs it (csrc/awq_moe_m1_math.cuh: 4 column words, their
// records, dequant_word, mma_group) against the same group with a denormal decode: each pair of
// codes masked into bits 4-7 of its half is the exact half q * 2^-20 (a subnormal), so one HFMA2
// with the scale times 2^20 (two HMUL2 per column, exact while |s| < 2^-4; a real kernel would
// need a fallback beyond) gives fp16(q * s + b) without the exact subtraction; the shifts move
// to the integer side (w << 4, w >> 4, w >> 8). Timing only: words and records change every
// iteration (an XOR and an add), the results feed the MMAs.
__device__ __forceinline__ void dequant_word_denorm(unsigned w, __half2 s20, __half2 b2,
                                                    unsigned (&o)[4]) {
  constexpr unsigned kMask = 0x00f000f0u;
  o[0] = qpn::h2_bits(__hfma2(qpn::bits_h2((w << 4) & kMask), s20, b2));  // k0, k1
  o[1] = qpn::h2_bits(__hfma2(qpn::bits_h2(w & kMask), s20, b2));         // k2, k3
  o[2] = qpn::h2_bits(__hfma2(qpn::bits_h2((w >> 4) & kMask), s20, b2));  // k4, k5
  o[3] = qpn::h2_bits(__hfma2(qpn::bits_h2((w >> 8) & kMask), s20, b2));  // k6, k7
}

template <bool kDenorm>
__global__ void __launch_bounds__(512, 1) group_kernel(unsigned seed) {
  unsigned word[4], rec[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    word[i] = seed * (threadIdx.x + 7 * i + 1);
    rec[i] = 0x9c002000u ^ ((seed * (threadIdx.x + i)) & 0x03ff03ffu);  // (s, b) halves
  }
  const uint4 xv = make_uint4(0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u);
  qpn::WarpAcc<false> acc;
  const __half2 k1024 = __floats2half2_rn(1024.0f, 1024.0f);
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    qpn::GroupWeights q;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned w = word[i] ^ it;
      const __half2 r = qpn::bits_h2(rec[i] + (static_cast<unsigned>(it) << 16));
      const __half2 s2 = __low2half2(r), b2 = __high2half2(r);
      if constexpr (kDenorm) {
        dequant_word_denorm(w, __hmul2(__hmul2(s2, k1024), k1024), b2, q.w[i]);
      } else {
        qpn::dequant_word(w, s2, b2, q.w[i]);
      }
    }
    qpn::mma_group<false>(acc, q, xv);
  }
  const long long t1 = clock64();
  if (__float_as_uint(acc.d[0][0] + acc.d[1][0]) == 0x12345678u) g_sink = 1u;
  if (threadIdx.x == 0 && blockIdx.x == 0) g_cycles = static_cast<unsigned long long>(t1 - t0);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  void (*kernels[])(unsigned, __half2, __half2) = {loop_kernel<kMma>,         loop_kernel<kFp16>,
                                 loop_kernel<kInt>,         loop_kernel<kMma | kFp16>,
                                 loop_kernel<kMma | kInt>,  loop_kernel<kFp16 | kInt>,
                                 loop_kernel<kMma | kFp16 | kInt>};
  const char* names[] = {"4 HMMA", "16 HADD2 + 16 HFMA2", "16 LOP3", "HMMA + FP16",
                         "HMMA + LOP3", "FP16 + LOP3", "all three (a kernel A group)"};
  std::printf("# cycles per iteration per warp scheduler (one CTA per SM, %d SMs, %d iterations)\n",
              sms, kIters);
  std::printf("%-30s %8s %8s %8s\n", "work per warp and iteration", "4 warps", "8 warps",
              "16 warps");
  for (int k = 0; k < 7; ++k) {
    std::printf("%-30s", names[k]);
    for (const int warps : {4, 8, 16}) {
      const __half2 sc = __floats2half2_rn(1.0001f, 0.9999f), bi = __floats2half2_rn(1e-4f, -1e-4f);
      kernels[k]<<<sms, warps * 32>>>(7u, sc, bi);  // warm-up
      kernels[k]<<<sms, warps * 32>>>(7u, sc, bi);
      cudaDeviceSynchronize();
      unsigned long long cycles = 0;
      cudaMemcpyFromSymbol(&cycles, g_cycles, sizeof(cycles));
      // Warps spread over the 4 schedulers: per scheduler, warps / 4 warps' iterations.
      std::printf(" %8.1f", static_cast<double>(cycles) / kIters / (warps / 4.0));
    }
    std::printf("\n");
  }
  void (*groups[])(unsigned) = {group_kernel<false>, group_kernel<true>};
  const char* group_names[] = {"group, operator's decode", "group, denormal decode"};
  for (int k = 0; k < 2; ++k) {
    std::printf("%-30s", group_names[k]);
    for (const int warps : {4, 8, 16}) {
      groups[k]<<<sms, warps * 32>>>(7u);  // warm-up
      groups[k]<<<sms, warps * 32>>>(7u);
      cudaDeviceSynchronize();
      unsigned long long cycles = 0;
      cudaMemcpyFromSymbol(&cycles, g_cycles, sizeof(cycles));
      std::printf(" %8.1f", static_cast<double>(cycles) / kIters / (warps / 4.0));
    }
    std::printf("\n");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
