// When do kernel A's groups land? Kernel A's arithmetic measured as if none of it ran under its
// stream (H200: kernel A alone 0.8 us slower than its loads alone, and 0.54 us slower again with
// every group's arithmetic run twice; docs/performance.md, tenth session). This streams kernel
// A's W13 bytes with its exact shape and per-lane loads (100 CTAs of 16 warps, 5 groups of
// 512 B codes + one 128 B record row per warp, all loads issued first), optionally with kernel
// B's W2 bytes in 160 more CTAs of 10 warps, and lane 0 of every warp stamps %globaltimer as it
// consumes its groups in order: stamp g is when groups 0..g had all landed, which is when
// in-order arithmetic can start group g. Reported, from the first CTA's start, median over the
// launches: the A CTAs' first group in (min over their warps), all their groups in (max), the
// spread between the two, and an issue model of in-order arithmetic over those stamps (each of
// an SM's 4 schedulers issues its 4 warps' groups one at a time, `cycles` per group, a warp's
// groups in order): when the last CTA would finish, and how far after its last data. Then the
// same launch with the operator's own arithmetic on each group (csrc/awq_moe_m1_math.cuh), in
// full (dequantization and MMAs), dequantization only, MMAs only (on the raw codes), in full
// with four accumulator chains, or in full with the next group dequantized ahead of this
// group's MMAs; each stamp taken once the group's result exists: when each CTA's work is done.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc scripts/microbench/arrival.cu -o /tmp/arrival
//   /tmp/arrival
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "awq_moe_m1_math.cuh"
#include "span.cuh"

namespace {

constexpr long long kCodes13 = 409600, kMeta13 = 102400, kCodes2 = 204800, kMeta2 = 51200;
constexpr long long kRoute = kCodes13 + kMeta13 + kCodes2 + kMeta2;  // an expert, 4-byte records
constexpr int kRoutes = qpn::kRoutes, kTiles = qpn::kTiles13, kWarps = 16;
constexpr int kGroupsPerWarp = qpn::kGroups13 / kWarps;
constexpr int kCtasA = kTiles * kRoutes, kCtasB = qpn::kHidden / 16;
constexpr int kStamps = kCtasA * kWarps * kGroupsPerWarp;

__constant__ const char* c_base[kRoutes];
__device__ unsigned long long g_stamp[kStamps];
__device__ unsigned long long g_cta_start[kCtasA];

// kMma's weights: the raw codes (XOR-ed with the records so both loads are used), shifted.
__device__ __forceinline__ qpn::GroupWeights raw_weights(const uint4& c, const uint4& m) {
  const unsigned words[4] = {c.x ^ m.x, c.y ^ m.y, c.z ^ m.z, c.w ^ m.w};
  qpn::GroupWeights q;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) q.w[i][j] = words[i] >> j;
  return q;
}

// The timer read takes `dep` as an operand, so it comes after the loads `dep` needs.
__device__ __forceinline__ unsigned long long stamp_after(unsigned dep) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer; // %1" : "=l"(t) : "r"(dep));
  return t;
}

// What a warp does with each landed group: nothing but consume it (kLoads), or the operator's
// arithmetic on it: in full, its dequantization only, or its MMAs only (raw codes as weights).
// kFull4: in full, with the group's four MMAs on four accumulators (chains of one MMA per
// group instead of two); kFullAhead: in full, the next group dequantized before this group's
// MMAs (once this group is in).
// kWgmma: in full, the MMAs as sm_90a warpgroup MMAs (m64n8k16, the dequantized weights from
// registers as A, each warp's 16 rows; x from shared memory as B, whose column n holds the x
// slice of the group's warp n of the warpgroup): one asynchronous tensor-core instruction per
// four warps' 16 x 16 weights instead of one mma.sync per warp's. Timing only (x is a constant).
// (A warpgroup's four warps issue each group's MMAs together, so they wait for each other.)
// kWgmmaPipe: the same, but each group's MMAs are waited for only after the next group's are
// issued (one commit group in flight), the previous group's registers kept alive meanwhile.
// kBothIndep: the dequantization and the MMAs both, but the MMAs on the raw codes (as kMma), the
// dequantized weights only XOR-ed into the stamp: both pipes busy, no dependency between them.
// kIntChain: the MMAs on weights made from the codes by three dependent integer operations per
// pair of weights (LOP3, PRMT, SHF, as many as the dequantization's LOP3, HADD2, HFMA2): a
// dependent chain into the MMAs without FP16 arithmetic.
enum Work {
  kLoads, kFull, kDequant, kMma, kFull4, kFullAhead, kWgmma, kWgmmaPipe, kBothIndep, kIntChain
};

// The operands both forms share: the two accumulators (outputs %0..%7) and, as inputs, the
// group's weights as the four MMAs' A fragments (16 registers) and the two B descriptors.
#define QPN_WG_ACC(d)                                                                         \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3])
#define QPN_WG_IN(q, desc0, desc1)                                                           \
  "r"(q.w[0][0]), "r"(q.w[1][0]), "r"(q.w[0][1]), "r"(q.w[1][1]), "r"(q.w[0][2]),           \
      "r"(q.w[1][2]), "r"(q.w[0][3]), "r"(q.w[1][3]), "r"(q.w[2][0]), "r"(q.w[3][0]),       \
      "r"(q.w[2][1]), "r"(q.w[3][1]), "r"(q.w[2][2]), "r"(q.w[3][2]), "r"(q.w[2][3]),       \
      "r"(q.w[3][3]), "l"(desc0), "l"(desc1)

// Four m64n8k16 warpgroup MMAs (two 16-row halves p x two k steps) of one group, committed and
// waited for in one statement, so that no other instruction can touch their registers meanwhile.
__device__ __forceinline__ void wgmma_group(float (&d)[2][4], const qpn::GroupWeights& q,
                                            unsigned long long desc0, unsigned long long desc1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.fence.sync.aligned;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%8,%9,%10,%11}, %24, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%12,%13,%14,%15}, %25, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%4,%5,%6,%7}, {%16,%17,%18,%19}, %24, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%4,%5,%6,%7}, {%20,%21,%22,%23}, %25, "
      "1, 1, 1, 0;\n\t"
      "wgmma.commit_group.sync.aligned;\n\t"
      "wgmma.wait_group.sync.aligned 0;"
      : QPN_WG_ACC(d)
      : QPN_WG_IN(q, desc0, desc1)
      : "memory");
#else
  __trap();
#endif
}

// The pipelined form: issue this group's four MMAs, then wait until only they are in flight
// (the previous group's are done). `prev` (the previous group's weights) is read-write here only
// so that its registers stay untouched until its MMAs are waited for.
__device__ __forceinline__ void wgmma_group_pipe(float (&d)[2][4], const qpn::GroupWeights& q,
                                                 qpn::GroupWeights& prev,
                                                 unsigned long long desc0,
                                                 unsigned long long desc1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.fence.sync.aligned;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%24,%25,%26,%27}, %40, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%28,%29,%30,%31}, %41, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%4,%5,%6,%7}, {%32,%33,%34,%35}, %40, "
      "1, 1, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%4,%5,%6,%7}, {%36,%37,%38,%39}, %41, "
      "1, 1, 1, 0;\n\t"
      "wgmma.commit_group.sync.aligned;\n\t"
      "wgmma.wait_group.sync.aligned 1;"
      : QPN_WG_ACC(d), "+r"(prev.w[0][0]), "+r"(prev.w[0][1]),
        "+r"(prev.w[0][2]), "+r"(prev.w[0][3]), "+r"(prev.w[1][0]), "+r"(prev.w[1][1]),
        "+r"(prev.w[1][2]), "+r"(prev.w[1][3]), "+r"(prev.w[2][0]), "+r"(prev.w[2][1]),
        "+r"(prev.w[2][2]), "+r"(prev.w[2][3]), "+r"(prev.w[3][0]), "+r"(prev.w[3][1]),
        "+r"(prev.w[3][2]), "+r"(prev.w[3][3])
      : QPN_WG_IN(q, desc0, desc1)
      : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_drain(float (&d)[2][4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),
                 "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
               :
               : "memory");
#endif
}

// A shared-memory matrix descriptor (no swizzle): B = 16 k x 8 n, K-major, as two 8 x 8 core
// matrices of 128 bytes (k 0..7, then k 8..15): leading (k) offset 128, stride (n) offset 256.
__device__ __forceinline__ unsigned long long smem_desc(const void* p) {
  const unsigned long long a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return ((a & 0x3FFFFull) >> 4) | ((128ull >> 4) << 16) | ((256ull >> 4) << 32);
}

template <int kWork>
__global__ void __launch_bounds__(512, 1) stream_kernel(bool with_w2, unsigned xbits) {
  span_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned acc = 0;
  if (blockIdx.x < kCtasA) {
    // Unit (tile, route): warp w owns groups 5w .. 5w + 4 of the tile's 80.
    const int tile = blockIdx.x % kTiles, route = blockIdx.x / kTiles;
    if (threadIdx.x == 0) g_cta_start[blockIdx.x] = now_ns();
    const char* base = c_base[route];
    const int g0 = warp * kGroupsPerWarp;
    const char* codes = base + (static_cast<long long>(tile) * 320 + 4 * g0) * 128 + 16 * lane;
    const char* meta = base + kCodes13 + (static_cast<long long>(g0) * 320 + tile * 32) * 4 +
                       16 * (lane >> 2);
    uint4 c[kGroupsPerWarp], m[kGroupsPerWarp];
#pragma unroll
    for (int g = 0; g < kGroupsPerWarp; ++g) {
      c[g] = load_cs(codes + g * 512);
      m[g] = load_cs(meta + g * 1280);
    }
    const uint4 xv = make_uint4(xbits, xbits, xbits, xbits);
    __shared__ __align__(128) unsigned xb[2][64];  // two k steps of B: 16 k x 8 n halves each
    if constexpr (kWork == kWgmma || kWork == kWgmmaPipe) {
      if (threadIdx.x < 128) xb[threadIdx.x >> 6][threadIdx.x & 63] = xbits;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
      __syncthreads();
    }
    const unsigned long long desc0 = smem_desc(xb[0]), desc1 = smem_desc(xb[1]);
    float wd[2][4] = {};
    qpn::GroupWeights wprev{};
    unsigned xacc = 0;  // kBothIndep: every group's dequantized weights, XOR-ed
    qpn::WarpAcc<false> wacc, wacc2;
    qpn::GroupWeights ahead;
    if constexpr (kWork == kFullAhead) qpn::dequant_group<false>(ahead, {c[0], m[0]});
#pragma unroll
    for (int g = 0; g < kGroupsPerWarp; ++g) {
      const qpn::GroupFrag<false> f{c[g], m[g]};
      if constexpr (kWork == kLoads) {
        acc ^= c[g].x ^ c[g].y ^ c[g].z ^ c[g].w ^ m[g].x ^ m[g].y ^ m[g].z ^ m[g].w;
      } else if constexpr (kWork == kFull) {
        qpn::dot_group<false, false>(wacc, f, xv);
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]);
      } else if constexpr (kWork == kDequant) {
        qpn::GroupWeights q;
        qpn::dequant_group<false>(q, f);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc ^= q.w[i][0] ^ q.w[i][1] ^ q.w[i][2] ^ q.w[i][3];
      } else if constexpr (kWork == kFull4) {
        qpn::GroupWeights q;
        qpn::dequant_group<false>(q, f);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const unsigned(&w0)[4] = q.w[2 * p];
          const unsigned(&w1)[4] = q.w[2 * p + 1];
          qpn::mma_m16n8k16(wacc.d[p], w0[0], w1[0], w0[1], w1[1], xv.x, xv.y);
          qpn::mma_m16n8k16(wacc2.d[p], w0[2], w1[2], w0[3], w1[3], xv.z, xv.w);
        }
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0] + wacc2.d[0][0] + wacc2.d[1][0]);
      } else if constexpr (kWork == kWgmma) {
        qpn::GroupWeights q;
        qpn::dequant_group<false>(q, f);
        wgmma_group(wd, q, desc0, desc1);
        acc = __float_as_uint(wd[0][0] + wd[1][0]);
      } else if constexpr (kWork == kBothIndep) {
        qpn::GroupWeights q;
        qpn::dequant_group<false>(q, f);
        qpn::mma_group<false>(wacc, raw_weights(c[g], m[g]), xv);
#pragma unroll
        for (int i = 0; i < 4; ++i) xacc ^= q.w[i][0] ^ q.w[i][1] ^ q.w[i][2] ^ q.w[i][3];
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]) ^ xacc;
      } else if constexpr (kWork == kIntChain) {
        qpn::GroupWeights q;
        const unsigned words[4] = {c[g].x, c[g].y, c[g].z, c[g].w};
        const unsigned meta[4] = {m[g].x, m[g].y, m[g].z, m[g].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            // Three dependent integer steps per pair of weights, like mask -> subtract -> FMA.
            unsigned v = qpn::and_or<0x000f000fu, 0x64006400u>(words[i] >> (4 * j));
            v = __byte_perm(v, meta[i], 0x5410);
            v = __funnelshift_l(v, meta[i], 3);
            q.w[i][j] = v;
          }
        }
        qpn::mma_group<false>(wacc, q, xv);
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]);
      } else if constexpr (kWork == kWgmmaPipe) {
        // Stamp g marks group g - 1's MMAs done (and group g's issued); the last, all of them.
        qpn::GroupWeights q;
        qpn::dequant_group<false>(q, f);
        wgmma_group_pipe(wd, q, wprev, desc0, desc1);
        wprev = q;
        if (g + 1 == kGroupsPerWarp) wgmma_drain(wd);
        acc = __float_as_uint(wd[0][0] + wd[1][0]);
      } else if constexpr (kWork == kFullAhead) {
        const qpn::GroupWeights q = ahead;
        if (g + 1 < kGroupsPerWarp) qpn::dequant_group<false>(ahead, {c[g + 1], m[g + 1]});
        qpn::mma_group<false>(wacc, q, xv);
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]);
      } else {
        qpn::mma_group<false>(wacc, raw_weights(c[g], m[g]), xv);
        acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]);
      }
      const unsigned long long t = stamp_after(acc);
      if (lane == 0) g_stamp[(blockIdx.x * kWarps + warp) * kGroupsPerWarp + g] = t;
    }
  } else if (with_w2 && warp < kRoutes) {
    // Unit B's 16-column tile blockIdx.x - kCtasA: warp r loads route r's W2 share.
    const char* w2 = c_base[warp] + kCodes13 + kMeta13;
    acc = load_unit_b_w2(w2, w2 + kCodes2, blockIdx.x - kCtasA, lane);
  }
  span_end(acc);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Launch {
  double span, first_min, first_med, first_max, last_min, last_med, last_max, spread_med;
  double model_end, model_after;  // the issue model: last CTA's finish, and after its last data
};

// stamps (ns from the first A CTA's start) -> the issue model for one CTA: the time its last
// group would be done with `cycles` of issue per group at `ghz`.
double model_cta(const unsigned long long* s, double t0, double cycles, double ghz) {
  const double cost = cycles / ghz;  // ns per group on one scheduler
  double finish = 0.0;
  for (int q = 0; q < 4; ++q) {  // scheduler q runs warps q, q + 4, q + 8, q + 12
    double sched = 0.0;
    double warp_done[4] = {0, 0, 0, 0};
    int next[4] = {0, 0, 0, 0};
    for (int done = 0; done < 4 * kGroupsPerWarp; ++done) {
      // The ready group that can start first (a warp's groups in order).
      int best = -1;
      double best_start = 1e300;
      for (int k = 0; k < 4; ++k) {
        if (next[k] >= kGroupsPerWarp) continue;
        const int w = q + 4 * k;
        const double ready = std::max(s[w * kGroupsPerWarp + next[k]] - t0, warp_done[k]);
        const double start = std::max(ready, sched);
        if (start < best_start) best_start = start, best = k;
      }
      sched = best_start + cost;
      warp_done[best] = sched;
      ++next[best];
    }
    finish = std::max(finish, sched);
  }
  return finish;
}

}  // namespace

int main() {
  int device = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  const double ghz = clock_khz / 1e6;
  const long long bytes = 8ll << 30;
  char* buf = region_buffer(bytes);
  if (buf == nullptr) return 1;
  const long long experts = bytes / kRoute;
  std::mt19937 rng(7);
  std::vector<unsigned long long> stamps(kStamps), starts(kCtasA);
  std::printf("# %d A CTAs of %d warps x %d groups; clock %.2f GHz; ns from the first A CTA's "
              "start, median of 30 launches; a CTA's groups done = in, for loads\n",
              kCtasA, kWarps, kGroupsPerWarp, ghz);
  const char* names[] = {"loads", "full",  "dequant", "mma",        "full4",
                         "ahead", "wgmma", "wgmma-pipe", "both-indep", "int-chain"};
  void (*kernels[])(bool, unsigned) = {
      stream_kernel<kLoads>,     stream_kernel<kFull>,       stream_kernel<kDequant>,
      stream_kernel<kMma>,       stream_kernel<kFull4>,      stream_kernel<kFullAhead>,
      stream_kernel<kWgmma>,     stream_kernel<kWgmmaPipe>,  stream_kernel<kBothIndep>,
      stream_kernel<kIntChain>};
  for (const bool with_w2 : {false, true}) {
    for (int work = 0; work < 10; ++work) {
      const double cycles = 57.0;  // the operator's issue slots per group and warp (sm_90 SASS)
      std::vector<Launch> runs;
      for (int it = 0; it < 31; ++it) {
        const char* bases[kRoutes];
        for (auto& b : bases) b = buf + (rng() % experts) * kRoute;
        cudaMemcpyToSymbol(c_base, bases, sizeof(bases));
        span_reset();
        kernels[work]<<<with_w2 ? kCtasA + kCtasB : kCtasA, 512>>>(with_w2, 0x3c003c00u);
        const double span = span_us();
        if (it == 0) continue;  // warm-up
        cudaMemcpyFromSymbol(stamps.data(), g_stamp, sizeof(unsigned long long) * kStamps);
        cudaMemcpyFromSymbol(starts.data(), g_cta_start, sizeof(unsigned long long) * kCtasA);
        const double t0 = static_cast<double>(*std::min_element(starts.begin(), starts.end()));
        std::vector<double> first, last, spread;
        double model_end = 0.0, model_after = 0.0;
        for (int cta = 0; cta < kCtasA; ++cta) {
          double lo = 1e300, hi = 0.0;
          for (int w = 0; w < kWarps; ++w) {
            const unsigned long long* s = &stamps[(cta * kWarps + w) * kGroupsPerWarp];
            lo = std::min(lo, s[0] - t0);
            hi = std::max(hi, s[kGroupsPerWarp - 1] - t0);
          }
          first.push_back(lo);
          last.push_back(hi);
          spread.push_back(hi - lo);
          const double end = model_cta(&stamps[cta * kWarps * kGroupsPerWarp], t0, cycles, ghz);
          if (end > model_end) model_end = end, model_after = end - hi;
        }
        runs.push_back({span * 1000.0, *std::min_element(first.begin(), first.end()),
                        median(first), *std::max_element(first.begin(), first.end()),
                        *std::min_element(last.begin(), last.end()), median(last),
                        *std::max_element(last.begin(), last.end()), median(spread), model_end,
                        model_after});
      }
      auto med = [&](double Launch::*f) {
        std::vector<double> v;
        for (const Launch& r : runs) v.push_back(r.*f);
        return median(v);
      };
      std::printf("%-7s %-10s span %5.0f | first group done min/med/max %5.0f %5.0f %5.0f | all "
                  "done %5.0f %5.0f %5.0f | per-CTA spread %4.0f",
                  with_w2 ? "A+W2" : "A alone", names[work], med(&Launch::span),
                  med(&Launch::first_min), med(&Launch::first_med), med(&Launch::first_max),
                  med(&Launch::last_min), med(&Launch::last_med), med(&Launch::last_max),
                  med(&Launch::spread_med));
      if (work == kLoads) {
        std::printf(" | issue model (%.0f cycles/group): last CTA done %5.0f, %4.0f after its "
                    "last data",
                    cycles, med(&Launch::model_end), med(&Launch::model_after));
      }
      std::printf("\n");
    }
  }
  return finish(buf);
}
