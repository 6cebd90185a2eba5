// Does kernel A's arithmetic hide better with its groups spread differently? Kernel A runs 100
// CTAs (10 routes x 10 tiles of 32 columns) of 16 warps, 80 groups each, warp w the groups
// 5w .. 5w + 4: 100 of the H200's 132 SMs carry all of W13's dequantization and MMAs. This
// streams W13 with kernel A's per-lane loads (all of a warp's loads issued first), with or
// without the operator's own group arithmetic (csrc/awq_moe_m1_math.cuh, dot_group, x a
// constant), in these work splits:
//   tiles:  kernel A's, 100 CTAs, one tile each;
//   spread: 13 CTAs per route (130), CTA p the groups [800 p / 13, 800 (p + 1) / 13) of the
//           route's 800 (tile, group) blocks in tile order (61-62, one or two tiles);
// and, within a CTA, W warps (8 to 32), each a contiguous share of the CTA's groups, or
// (interleaved) the groups w, w + W, w + 2W, ... (reversed: consumed last first).
// The spread split leaves out what a real operator would then need (a second accumulator set
// where a warp's groups span two tiles, and the fixed-order sum of a tile's parts across CTAs):
// it times only what the split does to the stream and its arithmetic. Prints the launch span
// (first CTA start to last CTA end, %globaltimer), median and min over 30 launches, each on ten
// random experts of an 8 GiB buffer. With --w2, kernel B's W2 bytes are read too, by 160 more
// CTAs of the same kernel (their first 10 warps load as unit B does): a rough mix only, since
// those CTAs have the A CTAs' size and registers, unlike the operator's kernel B.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc scripts/microbench/spread_a.cu -o /tmp/spread_a
//   /tmp/spread_a [--w2]
//
// On the H200 (docs/evidence/, the eleventh session): A alone, tiles loads 2.37-2.43 us, tiles
// full 3.23, 32 warps interleaved 2.82-2.85, spread full 2.91-2.94; in the operator none of these
// gained (docs/performance.md).
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "awq_moe_m1_math.cuh"
#include "span.cuh"

namespace {

constexpr long long kCodes13 = 409600, kMeta13 = 102400, kCodes2 = 204800, kMeta2 = 51200;
constexpr long long kRoute = kCodes13 + kMeta13 + kCodes2 + kMeta2;  // an expert, 4-byte records
constexpr int kRoutes = qpn::kRoutes, kCtasB = qpn::kHidden / 16;
constexpr int kRouteGroups = qpn::kTiles13 * qpn::kGroups13;  // 10 tiles x 80 groups

__constant__ const char* c_base[kRoutes];

// Group G (tile G / 80, group G % 80) of a route: its 512 B of codes and its 128 B record row.
__device__ __forceinline__ void load_block(const char* base, int G, int lane, uint4& c, uint4& m) {
  const int tile = G / 80, g = G % 80;
  c = load_cs(base + static_cast<long long>(G) * 512 + 16 * lane);
  m = load_cs(base + kCodes13 + (static_cast<long long>(g) * 320 + tile * 32) * 4 +
              16 * (lane >> 2));
}

template <bool kFull, int kParts, int kWarpsT, bool kContig, bool kReverse = false>
__global__ void __launch_bounds__(kWarpsT * 32, 1) stream_kernel(bool with_w2, unsigned xbits) {
  span_begin();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kCtasA = kRoutes * kParts;
  constexpr int kMaxGroups = (kRouteGroups / kParts + kWarpsT) / kWarpsT;
  unsigned acc = 0;
  if (blockIdx.x < kCtasA) {
    // CTA p of a route: its groups [800 p / kParts, 800 (p + 1) / kParts).
    const int route = blockIdx.x / kParts, p = blockIdx.x % kParts;
    const int lo = kRouteGroups * p / kParts, hi = kRouteGroups * (p + 1) / kParts;
    // kContig: warp w a contiguous share of the range; else every kWarpsT-th group from the w-th.
    const int first = kContig ? lo + (hi - lo) * warp / kWarpsT : lo + warp;
    const int stride = kContig ? 1 : kWarpsT;
    const int count = kContig ? lo + (hi - lo) * (warp + 1) / kWarpsT - first
                              : (first < hi ? (hi - first + kWarpsT - 1) / kWarpsT : 0);
    const char* base = c_base[route];
    uint4 c[kMaxGroups], m[kMaxGroups];
#pragma unroll
    for (int i = 0; i < kMaxGroups; ++i) {
      if (i < count) load_block(base, first + i * stride, lane, c[i], m[i]);
    }
    const uint4 xv = make_uint4(xbits, xbits, xbits, xbits);
    qpn::WarpAcc<false> wacc;
#pragma unroll
    for (int j = 0; j < kMaxGroups; ++j) {
      const int i = kReverse ? kMaxGroups - 1 - j : j;
      if (i >= count) continue;
      if constexpr (kFull) {
        qpn::dot_group<false, false>(wacc, qpn::GroupFrag<false>{c[i], m[i]}, xv);
      } else {
        acc ^= c[i].x ^ c[i].y ^ c[i].z ^ c[i].w ^ m[i].x ^ m[i].y ^ m[i].z ^ m[i].w;
      }
    }
    if constexpr (kFull) acc = __float_as_uint(wacc.d[0][0] + wacc.d[1][0]);
  } else if (with_w2 && warp < kRoutes) {
    // Unit B's 16-column tile blockIdx.x - kCtasA: warp r loads route r's W2 share.
    const char* w2 = c_base[warp] + kCodes13 + kMeta13;
    acc = load_unit_b_w2(w2, w2 + kCodes2, blockIdx.x - kCtasA, lane);
  }
  span_end(acc);
}

}  // namespace

int main(int argc, char** argv) {
  const bool w2 = argc > 1 && std::strcmp(argv[1], "--w2") == 0;
  const long long bytes = 8ll << 30;
  char* buf = region_buffer(bytes);
  if (buf == nullptr) return 1;
  const long long experts = bytes / kRoute;
  std::mt19937 rng(7);
  struct Mode {
    const char* name;
    void (*kernel)(bool, unsigned);
    int ctas, threads;
  };
  const Mode modes[] = {
      {"tiles loads", stream_kernel<false, 10, 16, true>, 100, 512},
      {"tiles full", stream_kernel<true, 10, 16, true>, 100, 512},
      {"tiles full interleaved", stream_kernel<true, 10, 16, false>, 100, 512},
      {"tiles full 20 warps", stream_kernel<true, 10, 20, true>, 100, 640},
      {"tiles full 20 interl.", stream_kernel<true, 10, 20, false>, 100, 640},
      {"tiles full 24 interl.", stream_kernel<true, 10, 24, false>, 100, 768},
      {"tiles full 28 interl.", stream_kernel<true, 10, 28, false>, 100, 896},
      {"tiles full 32 warps", stream_kernel<true, 10, 32, true>, 100, 1024},
      {"tiles loads 32 interl.", stream_kernel<false, 10, 32, false>, 100, 1024},
      {"tiles full 32 interl.", stream_kernel<true, 10, 32, false>, 100, 1024},
      {"tiles full 32 interl. rev", stream_kernel<true, 10, 32, false, true>, 100, 1024},
      {"spread loads", stream_kernel<false, 13, 16, true>, 130, 512},
      {"spread full", stream_kernel<true, 13, 16, true>, 130, 512},
      {"spread full 32 warps", stream_kernel<true, 13, 32, true>, 130, 1024},
      {"spread full 32 interl.", stream_kernel<true, 13, 32, false>, 130, 1024},
  };
  std::printf("# W13%s spans, us: median and min of 30 launches\n", w2 ? " and W2" : "");
  for (const Mode& mode : modes) {
    std::vector<double> spans;
    for (int it = 0; it < 31; ++it) {
      const char* bases[kRoutes];
      for (auto& b : bases) b = buf + (rng() % experts) * kRoute;
      cudaMemcpyToSymbol(c_base, bases, sizeof(bases));
      span_reset();
      mode.kernel<<<w2 ? mode.ctas + kCtasB : mode.ctas, mode.threads>>>(w2, 0x3c003c00u);
      const double span = span_us();
      if (it > 0) spans.push_back(span);  // the first launch warms up
    }
    std::sort(spans.begin(), spans.end());
    std::printf("%-7s %-26s %4d CTAs  span median %5.2f  min %5.2f\n",
                w2 ? "A+W2" : "A alone", mode.name,
                w2 ? mode.ctas + kCtasB : mode.ctas, spans[spans.size() / 2], spans.front());
  }
  return finish(buf);
}
