// The operator's memory access patterns without its arithmetic: how long one launch takes to
// stream the ten routes' bytes (7.68 MB at 4-byte metadata) with kernel A's and kernel B's
// CTA shapes and per-lane loads, against the read floor's shape over the same bytes. Each
// launch picks ten fresh expert regions (the bank layout of one TP4 expert: W13 codes, W13
// records, W2 codes, W2 records) at random places of an 8 GiB buffer, so nothing comes from L2;
// every CTA issues all its loads before using any. Span: first CTA start to last CTA end
// (%globaltimer), median over the launches.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc scripts/microbench/op_patterns.cu -o /tmp/op_patterns
//   /tmp/op_patterns
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

constexpr long long kCodes13 = 409600, kMeta13 = 102400, kCodes2 = 204800, kMeta2 = 51200;
constexpr long long kRoute = kCodes13 + kMeta13 + kCodes2 + kMeta2;  // 768,000 B
constexpr int kRoutes = qpn::kRoutes;

// The ten routes' expert regions, set before each launch (a kernel argument indexed by a
// run-time route would live in local memory).
__constant__ const char* c_base[kRoutes];

// Kernel A's unit (tile, route), `warps` warps splitting the 80 groups of one 32-column tile:
// per group a lane loads 16 B of codes (the group's 512 B contiguous) and 16 B of records
// (the tile's 128 B of the group's 1280 B record row, 4 lanes per 16 B). kMetaTileMajor: the
// records laid out tile by tile instead (each unit's 10 KB contiguous).
template <bool kMetaTileMajor>
__device__ unsigned unit_a(int tile, int route, int first_group, int groups) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base = c_base[route];
  uint4 c[5], m[5];
#pragma unroll
  for (int g = 0; g < 5; ++g) {
    if (g >= groups) break;
    const long long gg = first_group + warp * groups + g;
    c[g] = __ldcs(reinterpret_cast<const uint4*>(base + tile * 40960 + gg * 512) + lane);
    const long long meta = kMetaTileMajor ? kCodes13 + tile * 10240 + gg * 128
                                          : kCodes13 + gg * 1280 + tile * 128;
    m[g] = __ldcs(reinterpret_cast<const uint4*>(base + meta) + (lane >> 2));
  }
  unsigned acc = 0;
#pragma unroll
  for (int g = 0; g < 5; ++g) {
    if (g >= groups) break;
    acc ^= fold(c[g]) ^ fold(m[g]);
  }
  return acc;
}

// Kernel B's 16-column unit (tile 0..159), warp = route: per group a lane loads 8 B of codes
// (two adjacent columns of the half tile) and 8 B of records.
__device__ unsigned unit_b16(int tile) {
  const int route = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base = c_base[route] + kCodes13 + kMeta13;
  uint2 c[5], m[5];
#pragma unroll
  for (int g = 0; g < 5; ++g) {
    const long long word2 =
        (tile / 2) * 320 + g * 64 + 16 * (lane & 3) + (lane >> 2) + 8 * (tile & 1);
    c[g] = __ldcs(reinterpret_cast<const uint2*>(base) + word2);
    m[g] = __ldcs(reinterpret_cast<const uint2*>(base + kCodes2 + g * 10240 +
                                                (tile * 16 + 2 * (lane >> 2)) * 4));
  }
  unsigned acc = 0;
#pragma unroll
  for (int g = 0; g < 5; ++g) acc ^= fold(c[g]) ^ fold(m[g]);
  return acc;
}

// 0: kernel A (100 CTAs of 16 warps); 1: kernel A's records tile-major; 2: kernel A in 200 CTAs
// of 8 warps (K halves); 3: kernel B (160 CTAs of 10 warps); 4: A then B in one grid of 260
// CTAs of 16 warps (B's use 10 of them).
__global__ void pattern_kernel(int mode) {
  span_begin();
  const int b = blockIdx.x;
  unsigned acc = 0;
  switch (mode) {
    case 0: acc = unit_a<false>(b % 10, b / 10, 0, 5); break;
    case 1: acc = unit_a<true>(b % 10, b / 10, 0, 5); break;
    case 2: acc = unit_a<false>((b / 2) % 10, b / 20, (b & 1) * 40, 5); break;
    case 3: acc = unit_b16(b); break;
    default:
      if (b < 100) {
        acc = unit_a<false>(b % 10, b / 10, 0, 5);
      } else if (threadIdx.x < 320) {
        acc = unit_b16(b - 100);
      }
  }
  span_end(acc);
}

// The read floor's shape over the same ten regions: grid (chunks, route), 256 threads, each
// thread 4 contiguous 16 B loads of one 16 KB chunk.
__global__ void floor_kernel() {
  span_begin();
  span_end(floor_chunk(c_base[blockIdx.y], kRoute));
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const long long bytes = 8ll << 30;
  char* buf = region_buffer(bytes);
  if (buf == nullptr) return 1;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<long long> pick(0, (bytes - kRoute) / 4096);
  struct Case {
    const char* name;
    int mode, ctas, threads;
    double mb;
  };
  const Case cases[] = {
      {"read floor shape (470 x 256), all 7.68 MB", -1, 480, 256, 7.68},
      {"kernel A (100 x 512), W13 5.12 MB", 0, 100, 512, 5.12},
      {"kernel A, records tile-major", 1, 100, 512, 5.12},
      {"kernel A in 200 x 256 (K halves)", 2, 200, 256, 5.12},
      {"kernel B (160 x 320), W2 2.56 MB", 3, 160, 320, 2.56},
      {"kernel A + kernel B in one grid, 7.68 MB", 4, 260, 512, 7.68},
  };
  std::printf("# %s, %d SMs; one launch streams the ten routes' bytes, span median of 30\n",
              prop.name, prop.multiProcessorCount);
  for (const Case& c : cases) {
    std::vector<double> spans;
    for (int rep = 0; rep < 32; ++rep) {
      const char* bases[kRoutes];
      for (int i = 0; i < kRoutes; ++i) bases[i] = buf + pick(rng) * 4096;
      cudaMemcpyToSymbol(c_base, bases, sizeof(bases));
      span_reset();
      if (c.mode < 0) {
        floor_kernel<<<dim3(static_cast<unsigned>((kRoute / 16 + 1023) / 1024), kRoutes), 256>>>();
      } else {
        pattern_kernel<<<c.ctas, c.threads>>>(c.mode);
      }
      const double us = span_us();
      if (rep >= 2) spans.push_back(us);
    }
    std::sort(spans.begin(), spans.end());
    const double us = spans[spans.size() / 2];
    std::printf("%-44s %7.2f us  %6.0f GB/s  (p10 %.2f, p90 %.2f)\n", c.name, us, c.mb * 1e3 / us,
                spans[spans.size() / 10], spans[spans.size() * 9 / 10]);
  }
  return finish(buf);
}
