// Can W13 land before W2? The operator's tail (partial sums, SwiGLU, h handed to the W2 side,
// the MMAs with h, the route combine) can only start once the last W13 byte is in; if W13
// landed well before the last W2 byte, most of that tail would hide under the W2 stream. This
// streams the ten routes' W13 (5.12 MB) and W2 (2.56 MB) bytes in one launch with different
// placements and issue orders, and reports per launch when the last CTA had all its W13 bytes
// (t13), when the last CTA had all its W2 bytes (t2), and the span (first CTA start to last
// CTA end), all from the first CTA's start, median over the launches. Every thread issues all
// its loads (16-byte, evict-first) before using any, except where a case says otherwise; each
// launch reads ten fresh expert regions of an 8 GiB buffer, so nothing comes from L2.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc scripts/microbench/overlap.cu -o /tmp/overlap
//   /tmp/overlap
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "awq_moe_m1_geometry.h"
#include "span.cuh"

namespace {

constexpr long long kW13 = 409600 + 102400, kW2 = 204800 + 51200;  // per route, 4-byte records
constexpr long long kRoute = kW13 + kW2;
constexpr int kRoutes = qpn::kRoutes;
constexpr unsigned kRoute13 = kW13 / 16, kRoute2 = kW2 / 16;  // 16-byte chunks per route
constexpr unsigned kChunks13 = kRoute13 * kRoutes, kChunks2 = kRoute2 * kRoutes;
constexpr int kMaxCtas = 1024;

__constant__ const char* c_base[kRoutes];
__device__ unsigned long long g_t13[kMaxCtas], g_t2[kMaxCtas];

// Issue orders. kW13First: each thread issues its W13 loads, then its W2 loads. kW2First: the
// reverse. kW2AfterW13: W2 issued only once the CTA has all its W13. kW2Delayed: W2 issued
// `delay_ns` after the CTA's start. kSplitWarps: the first half of the warps load W13, the
// second half W2, at once.
enum Order { kW13First, kW2First, kW2AfterW13, kW2Delayed, kSplitWarps };

struct Plan {
  int order;
  int ctas13;   // CTAs [0, ctas13) carry W13, in equal contiguous ranges
  int first2;   // CTAs [first2, first2 + ctas2) carry W2
  int ctas2;
  int delay_ns;
};

// 32-bit index arithmetic with constant divisors (a multiply and a shift), so that a thread
// issues its loads back to back.
__device__ __forceinline__ const char* chunk13(unsigned j) {
  const unsigned r = j / kRoute13;
  return c_base[r] + (j - r * kRoute13) * 16u;
}
__device__ __forceinline__ const char* chunk2(unsigned j) {
  const unsigned r = j / kRoute2;
  return c_base[r] + kW13 + (j - r * kRoute2) * 16u;
}

// Thread `t` of `n` loads chunks lo + t, lo + t + n, ... below hi (at most L of them).
template <int L, bool k13>
__device__ __forceinline__ void issue(uint4 (&v)[L], unsigned lo, unsigned hi, unsigned t,
                                      unsigned n) {
#pragma unroll
  for (int i = 0; i < L; ++i) {
    const unsigned j = lo + t + i * n;
    v[i] = j < hi ? load_cs(k13 ? chunk13(j) : chunk2(j)) : make_uint4(0, 0, 0, 0);
  }
}
template <int L>
__device__ __forceinline__ unsigned fold(const uint4 (&v)[L]) {
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < L; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  return acc;
}

// The time at which every thread's `acc` exists: a barrier, then a shared-memory load that
// waits for it (a clock read right after __syncthreads() would mark this warp's arrival only),
// then the timer read with the loaded value as its operand.
__device__ __forceinline__ unsigned long long all_in(unsigned acc, unsigned* s) {
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
  __syncthreads();
  unsigned long long t = 0;
  if (threadIdx.x == 0) {
    unsigned x = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) x ^= s[w];
    asm volatile("mov.u64 %0, %%globaltimer; // %1" : "=l"(t) : "r"(x));
    if (x == 0x12345678u) g_sink = x;
  }
  __syncthreads();
  return t;
}

template <int L13, int L2>
__global__ void overlap_kernel(Plan p) {
  __shared__ unsigned s[32];
  span_begin();
  const unsigned long long t0 = now_ns();
  const int b = blockIdx.x;
  const bool has13 = b < p.ctas13, has2 = b >= p.first2 && b < p.first2 + p.ctas2;
  // Equal contiguous ranges: CTA i of c gets [i * N / c, (i + 1) * N / c) (N * c < 2^32).
  const unsigned lo13 = has13 ? kChunks13 * b / p.ctas13 : 0u;
  const unsigned hi13 = has13 ? kChunks13 * (b + 1) / p.ctas13 : 0u;
  const unsigned lo2 = has2 ? kChunks2 * (b - p.first2) / p.ctas2 : 0u;
  const unsigned hi2 = has2 ? kChunks2 * (b - p.first2 + 1) / p.ctas2 : 0u;
  unsigned t = threadIdx.x, n = blockDim.x;
  uint4 v13[L13], v2[L2];
  unsigned long long t13 = 0, t2 = 0;
  switch (p.order) {
    case kW13First:
      issue<L13, true>(v13, lo13, hi13, t, n);
      issue<L2, false>(v2, lo2, hi2, t, n);
      t13 = all_in(fold(v13), s);
      t2 = all_in(fold(v2), s);
      break;
    case kW2First:
      issue<L2, false>(v2, lo2, hi2, t, n);
      issue<L13, true>(v13, lo13, hi13, t, n);
      t13 = all_in(fold(v13), s);
      t2 = all_in(fold(v2), s);
      break;
    case kW2AfterW13:
      issue<L13, true>(v13, lo13, hi13, t, n);
      t13 = all_in(fold(v13), s);
      issue<L2, false>(v2, lo2, hi2, t, n);
      t2 = all_in(fold(v2), s);
      break;
    case kW2Delayed:
      issue<L13, true>(v13, lo13, hi13, t, n);
      while (now_ns() < t0 + static_cast<unsigned long long>(p.delay_ns)) {
      }
      issue<L2, false>(v2, lo2, hi2, t, n);
      t13 = all_in(fold(v13), s);
      t2 = all_in(fold(v2), s);
      break;
    default: {  // kSplitWarps
      const bool first = t < n / 2;
      n /= 2;
      t = first ? t : t - n;
      if (first) {
        issue<L13, true>(v13, lo13, hi13, t, n);
      } else {
        issue<L2, false>(v2, lo2, hi2, t, n);
      }
      const unsigned a13 = first ? fold(v13) : 0u, a2 = first ? 0u : fold(v2);
      t13 = all_in(a13, s);
      t2 = all_in(a2, s);
    }
  }
  if (threadIdx.x == 0) {
    g_t13[b] = has13 ? t13 : 0;
    g_t2[b] = has2 ? t2 : 0;
  }
  span_end(0);
}

struct Case {
  const char* name;
  Plan plan;
  int ctas, threads, l13, l2;  // (l13, l2): which instantiation
};

struct Result {
  double t13_max, t13_med, t2_max, t2_med, span;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void launch(const Case& c) {
  const dim3 grid(static_cast<unsigned>(c.ctas)), block(static_cast<unsigned>(c.threads));
  if (c.l13 == 5 && c.l2 == 3) overlap_kernel<5, 3><<<grid, block>>>(c.plan);
  else if (c.l13 == 3 && c.l2 == 2) overlap_kernel<3, 2><<<grid, block>>>(c.plan);
  else if (c.l13 == 7 && c.l2 == 3) overlap_kernel<7, 3><<<grid, block>>>(c.plan);
  else if (c.l13 == 7 && c.l2 == 10) overlap_kernel<7, 10><<<grid, block>>>(c.plan);
  else std::printf("no instantiation <%d, %d>\n", c.l13, c.l2);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int sms = prop.multiProcessorCount;
  const long long bytes = 8ll << 30;
  char* buf = region_buffer(bytes);
  if (buf == nullptr) return 1;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<long long> pick(0, (bytes - kRoute) / 4096);
  const int s = sms, s2 = 2 * sms;
  const Case cases[] = {
      {"all, 480 x 256 (about the floor's shape)", {kW13First, 480, 0, 480, 0}, 480, 256, 3, 2},
      {"W13 alone, 100 x 512", {kW13First, 100, 0, 0, 0}, 100, 512, 7, 3},
      {"W13 alone, SMs x 512", {kW13First, s, 0, 0, 0}, s, 512, 5, 3},
      {"W2 alone, SMs x 512", {kW13First, 0, 0, s, 0}, s, 512, 5, 3},
      {"all, SMs x 512, W13 then W2 (same threads)", {kW13First, s, 0, s, 0}, s, 512, 5, 3},
      {"all, SMs x 512, W2 then W13", {kW2First, s, 0, s, 0}, s, 512, 5, 3},
      {"all, SMs x 512, W2 after the CTA's W13", {kW2AfterW13, s, 0, s, 0}, s, 512, 5, 3},
      {"all, SMs x 512, W2 300 ns after start", {kW2Delayed, s, 0, s, 300}, s, 512, 5, 3},
      {"all, SMs x 512, W2 600 ns after start", {kW2Delayed, s, 0, s, 600}, s, 512, 5, 3},
      {"all, SMs x 512, W2 900 ns after start", {kW2Delayed, s, 0, s, 900}, s, 512, 5, 3},
      {"all, SMs x 1024, half the warps each", {kSplitWarps, s, 0, s, 0}, s, 1024, 5, 3},
      {"all, 2SMs x 256, W13 then W2", {kW13First, s2, 0, s2, 0}, s2, 256, 5, 3},
      {"W13 on 100, W2 on all SMs after it", {kW13First, 100, 0, s, 0}, s, 512, 7, 3},
      {"W13 on 100, W2 on the other SMs only", {kW13First, 100, 100, s - 100, 0}, s, 512, 7, 10},
      {"W13 on 100, W2 on all, W2 first", {kW2First, 100, 0, s, 0}, s, 512, 7, 3},
      {"op-like: W13 on 100, W2 on 160 others", {kW13First, 100, 100, 160, 0}, 260, 512, 7, 3},
      {"op-like, the W2 CTAs 400 ns late", {kW2Delayed, 100, 100, 160, 400}, 260, 512, 7, 3},
  };
  std::printf("# %s, %d SMs; ten routes' W13 (5.12 MB) and W2 (2.56 MB), one launch;\n"
              "# us from the first CTA start, median of 30 launches: last / median CTA with all\n"
              "# its W13, last / median CTA with all its W2, span; gap: median over the CTAs that load\n"
              "# both of the time from having all of its W13 to having all of its W2\n",
              prop.name, sms);
  std::printf("%-44s %7s %7s %7s %7s %7s %7s\n", "case", "t13", "t13med", "t2", "t2med", "span",
              "gap");
  for (const Case& c : cases) {
    std::vector<double> a, b, d, e, f, g;
    for (int rep = 0; rep < 32; ++rep) {
      const char* bases[kRoutes];
      for (int i = 0; i < kRoutes; ++i) bases[i] = buf + pick(rng) * 4096;
      cudaMemcpyToSymbol(c_base, bases, sizeof(bases));
      span_reset();
      launch(c);
      const double us = span_us();
      unsigned long long start = 0, t13[kMaxCtas], t2[kMaxCtas];
      cudaMemcpyFromSymbol(&start, g_start, sizeof(start));
      cudaMemcpyFromSymbol(t13, g_t13, sizeof(unsigned long long) * c.ctas);
      cudaMemcpyFromSymbol(t2, g_t2, sizeof(unsigned long long) * c.ctas);
      std::vector<double> x13, x2, gap;
      for (int i = 0; i < c.ctas; ++i) {
        if (t13[i]) x13.push_back((t13[i] - start) / 1000.0);
        if (t2[i]) x2.push_back((t2[i] - start) / 1000.0);
        if (t13[i] && t2[i]) gap.push_back((static_cast<double>(t2[i]) - t13[i]) / 1000.0);
      }
      if (!gap.empty() && rep >= 2) g.push_back(median(gap));
      if (rep < 2) continue;
      if (!x13.empty()) {
        a.push_back(*std::max_element(x13.begin(), x13.end()));
        b.push_back(median(x13));
      }
      if (!x2.empty()) {
        d.push_back(*std::max_element(x2.begin(), x2.end()));
        e.push_back(median(x2));
      }
      f.push_back(us);
    }
    auto m = [](const std::vector<double>& v) { return v.empty() ? 0.0 : median(v); };
    std::printf("%-44s %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f\n", c.name, m(a), m(b), m(d), m(e), m(f),
                m(g));
  }
  return finish(buf);
}
