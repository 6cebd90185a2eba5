// The operator's structure with no arithmetic: how long after the floor's span does one call
// end when every byte is loaded in the op's CTA shapes and every hand-off is real (shared-memory
// partials, tagged stores through L2, polls), but the dot products are XORs? Two structures:
//
// - two-kernel (today's default, modelled in one grid as op_patterns.cu does): 100 units A
//   (tile, route) stream W13, sum 16 warps' partials in shared memory and publish 16 values of h
//   with a tag; 160 units B (16 output columns each, warp = route) stream their W2, poll their
//   route's h, and combine the ten routes' y in router order.
// - K-split: unit (route, slice) streams the same W13 tile AND W2 rows 16*slice .. +15 for all
//   2560 columns, so it can form its route's partial y over those rows right after its h,
//   with no hand-off in between; the ten FP32 partials per (route, column) then meet in a
//   combiner that polls them (tagged 64-bit stores), sums them in slice order, rounds y and
//   combines the routes. Combiners: the 32 CTAs beside the 100 units, or units 0..79 after
//   their own work.
//
// And, to see what the two-kernel chain costs by itself: h published in 4 or 8 copies (fewer
// units B polling each L2 line), units B without their W2 loads, no loads at all (the hand-off
// and the tail alone), and an empty grid of the same size. The last launch's per-CTA stamps
// (data in, stores issued, polls done, end) are printed in the second round.
//
// 32 launches back to back after a 4 ms warm-up kernel (so that the SM clock is up, printed),
// each on ten fresh expert regions (nothing from L2); span: first CTA start to last CTA end
// (%globaltimer), median of the last 30. Every CTA of a launch is resident (at
// most two per SM), so the polls cannot deadlock.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc scripts/microbench/ksplit.cu -o /tmp/ksplit && /tmp/ksplit
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_fp16.h>
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
constexpr int kRoutes = qpn::kRoutes, kHidden = qpn::kHidden;

constexpr int kLaunches = 32;  // per case, back to back after a warm-up (clocks at speed)
// Launch i's ten expert regions: c_base[i * kRoutes + route].
__constant__ const char* c_base[kLaunches * kRoutes];
// Per launch: the first CTA's start and the last CTA's end (%globaltimer); CTA 0's clock64 and
// %globaltimer at its start and end (the SM clock during the launch).
__device__ unsigned long long g_first[kLaunches], g_last[kLaunches], g_clk[kLaunches][4];
__device__ unsigned g_sink2;
__device__ __forceinline__ void begin(int launch) {
  if (threadIdx.x == 0) {
    const unsigned long long t = now_ns();
    atomicMin(&g_first[launch], t);
    if (blockIdx.x == 0 && blockIdx.y == 0) {
      g_clk[launch][0] = clock64();
      g_clk[launch][1] = t;
    }
  }
}
__device__ __forceinline__ void end(int launch, unsigned acc) {
  if (acc == 0x12345678u) g_sink2 = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long t = now_ns();
    atomicMax(&g_last[launch], t);
    if (blockIdx.x == 0 && blockIdx.y == 0) {
      g_clk[launch][2] = clock64();
      g_clk[launch][3] = t;
    }
  }
}

__device__ unsigned long long g_h[8 * kRoutes * 80];  // tagged h pairs, up to 8 copies
__device__ unsigned long long g_part[kRoutes * 10 * kHidden];      // tagged FP32 partial y
__device__ __half g_out[kHidden];
// Per CTA of the last launch: %globaltimer when its data was in (after the partials' sum), when
// its stores were issued, when its polls were done, before and after span_end (0 where a step
// does not apply).
__device__ unsigned long long g_stamp[264][5];
__device__ __forceinline__ void stamp(int step) {
  if (threadIdx.x == 0) g_stamp[blockIdx.x][step] = now_ns();
}

__device__ __forceinline__ float as_small_float(unsigned v) {
  return __uint_as_float((v & 0x007fffffu) | 0x3f800000u);  // in [1, 2): no NaN, no overflow
}

// Unit A's W13 loads (tile, route): 16 warps x 5 groups, a lane 16 B of codes and 16 B of records
// per group (op_patterns.cu's unit_a); returns the lane's words folded.
__device__ __forceinline__ unsigned w13_loads(const char* const* base_of, int tile, int route) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* base = base_of[route];
  uint4 c[5], m[5];
#pragma unroll
  for (int g = 0; g < 5; ++g) {
    const long long gg = warp * 5 + g;
    c[g] = load_cs(base + tile * 40960 + gg * 512 + lane * 16);
    m[g] = load_cs(base + kCodes13 + gg * 1280 + tile * 128 + (lane >> 2) * 16);
  }
  unsigned acc = 0;
#pragma unroll
  for (int g = 0; g < 5; ++g) acc ^= fold(c[g]) ^ fold(m[g]);
  return acc;
}

// The 16 warps' partials meet in shared memory; warp 0 forms h (SwiGLU on the sums) for the
// tile's 16 values, left in hs. Ends with a __syncthreads.
__device__ __forceinline__ void reduce_swiglu(unsigned acc, float* part, float* hs) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  part[warp * 32 + lane] = as_small_float(acc);
  __syncthreads();
  if (warp == 0) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < 16; ++w) s += part[w * 32 + lane];
    const float up = __shfl_down_sync(0xffffffffu, s, 16);
    if (lane < 16) hs[lane] = s / (1.0f + __expf(-s)) * up;
  }
  __syncthreads();
}

// ---- two-kernel structure -------------------------------------------------------------------

// kReplicas: h published in that many copies (unit B b polls copy b % kReplicas), so that fewer
// units B poll each L2 line.
// kW13 false (diagnostic): no W13 loads either, only the hand-off and the tail.
template <int kReplicas, bool kW13>
__device__ void two_kernel_a(const char* const* base_of, int tile, int route, unsigned tag,
                             float* part, float* hs) {
  const unsigned acc = kW13 ? w13_loads(base_of, tile, route) : 0u;
  reduce_swiglu(acc, part, hs);
  stamp(0);
  if (threadIdx.x < 8 * kReplicas) {
    const int i = threadIdx.x & 7, copy = threadIdx.x >> 3;
    const unsigned lo = __half_as_ushort(__float2half_rn(hs[2 * i]));
    const unsigned hi = __half_as_ushort(__float2half_rn(hs[2 * i + 1]));
    st_relaxed(&g_h[(copy * kRoutes + route) * 80 + tile * 8 + i],
               (static_cast<unsigned long long>(tag) << 32) | (hi << 16) | lo);
  }
}

// kW2 false (diagnostic): no W2 loads, so the hand-off runs beside W13's stream only.
template <int kReplicas, bool kW2>
__device__ void two_kernel_b(const char* const* base_of, int b, unsigned tag, float* ys,
                             const float* rw) {
  const int route = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (route < kRoutes) {
    const char* base = base_of[route] + kCodes13 + kMeta13;
    const unsigned acc = kW2 ? load_unit_b_w2(base, base + kCodes2, b, lane) : 0u;
    // Poll the route's 80 tagged words (lane, lane + 32, lane + 64).
    const unsigned long long* src = g_h + ((b % kReplicas) * kRoutes + route) * 80 + lane;
    unsigned long long v[3];
    const unsigned long long fresh = static_cast<unsigned long long>(tag) << 32;
    unsigned polls = 0;
    bool ok;
    do {  // all three words of a lane in flight at once, then checked
      v[0] = ld_relaxed(src);
      v[1] = ld_relaxed(src + 32);
      v[2] = lane < 16 ? ld_relaxed(src + 64) : fresh;
      ok = (v[0] >> 32) == tag && (v[1] >> 32) == tag && (v[2] >> 32) == tag;
      if (++polls > (1u << 24)) __trap();
    } while (!__all_sync(0xffffffffu, ok));
    unsigned hbits = static_cast<unsigned>(v[0] ^ v[1] ^ v[2]);
    hbits = __reduce_xor_sync(0xffffffffu, hbits);
    const float y = __half2float(__float2half_rn(as_small_float(acc ^ hbits)));
    if (lane < 16) ys[route * 16 + lane] = y;
  }
  __syncthreads();
  stamp(2);
  if (threadIdx.x < 16) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) acc = fmaf(rw[r], ys[r * 16 + threadIdx.x], acc);
    g_out[b * 16 + threadIdx.x] = __float2half_rn(acc);
  }
}

// ---- K-split structure ----------------------------------------------------------------------

// Unit (route, slice): its W13 tile and W2 rows 16 * slice .. + 15 of every column: warp w owns
// columns 160w .. 160w + 159 (W2 tiles 5w .. 5w + 4: 256 contiguous bytes each, 8 per lane) and
// their 160 records of group slice / 2. kW2First: W2 loads issued before W13's.
template <bool kW2First>
__device__ void ksplit_unit(const char* const* base_of, int route, int slice, unsigned tag,
                            float* part, float* hs) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const char* w2 = base_of[route] + kCodes13 + kMeta13;
  uint2 c2[5];
  unsigned m2[5];
  unsigned acc13 = 0;
  if (!kW2First) acc13 = w13_loads(base_of, slice, route);
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    c2[j] = load_cs8(w2 + (5 * warp + j) * 2560 + slice * 256 + lane * 8);
    m2[j] = __ldcs(reinterpret_cast<const unsigned*>(w2 + kCodes2 + (slice / 2) * 10240 +
                                                     (160 * warp + lane + 32 * j) * 4));
  }
  if (kW2First) acc13 = w13_loads(base_of, slice, route);
  reduce_swiglu(acc13, part, hs);
  stamp(0);
  // The partial y of the warp's 160 columns over the slice's 16 rows (stand-in: the loaded words
  // XOR the bits of h), stored with the tag.
  unsigned hb = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) hb ^= __float_as_uint(hs[i]);
  unsigned long long* dst = g_part + (route * 10 + slice) * kHidden + 160 * warp + lane;
#pragma unroll
  for (int j = 0; j < 5; ++j) {
    const float p = as_small_float(c2[j].x ^ c2[j].y ^ m2[j] ^ hb);
    st_relaxed(dst + 32 * j, (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(p));
  }
  stamp(1);
}

// Combine `cols` columns from c0: pair (column, route) per thread (looping), the route's ten
// partials polled, summed in slice order and rounded; then the routes in router order.
// kNoPoll (timing only): one load per partial, tags not checked (the sums are then wrong).
template <bool kNoPoll = false>
__device__ void ksplit_combine(int c0, int cols, unsigned tag, float* ys, const float* rw) {
  for (int p = threadIdx.x; p < cols * kRoutes; p += blockDim.x) {
    const int c = p % cols, r = p / cols;
    const unsigned long long* src = g_part + r * 10 * kHidden + c0 + c;
    unsigned long long v[10];
#pragma unroll
    for (int s = 0; s < 10; ++s) v[s] = ld_relaxed(src + s * kHidden);
    unsigned polls = 0;
    while (!kNoPoll) {  // every stale partial asked again at once, then all checked
      bool ok = true;
#pragma unroll
      for (int s = 0; s < 10; ++s) ok = ok && (v[s] >> 32) == tag;
      if (ok) break;
      if (++polls > (1u << 24)) __trap();
#pragma unroll
      for (int s = 0; s < 10; ++s) {
        if ((v[s] >> 32) != tag) v[s] = ld_relaxed(src + s * kHidden);
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < 10; ++s) sum += __uint_as_float(static_cast<unsigned>(v[s]));
    ys[r * cols + c] = __half2float(__float2half_rn(sum));
  }
  __syncthreads();
  stamp(2);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRoutes; ++r) acc = fmaf(rw[r], ys[r * cols + c], acc);
    g_out[c0 + c] = __float2half_rn(acc);
  }
}

// The two-kernel structure in one grid of 260 CTAs (two per SM, 64 registers as the operator's
// kernels): 100 units A, then 160 units B using 320 threads.
template <int kReplicas, bool kW2, bool kW13 = true>
__global__ void __launch_bounds__(512, 2) two_kernel_structure(int launch, unsigned tag) {
  __shared__ float part[512];
  __shared__ float hs[16];
  __shared__ float ys[kRoutes * 16];
  __shared__ float rw[kRoutes];
  begin(launch);
  const char* const* base_of = c_base + launch * kRoutes;
  if (threadIdx.x < kRoutes) rw[threadIdx.x] = 0.1f * (threadIdx.x + 1);
  __syncthreads();
  const int b = blockIdx.x;
  if (b < 100) {
    two_kernel_a<kReplicas, kW13>(base_of, b % 10, b / 10, tag, part, hs);
  } else {
    two_kernel_b<kReplicas, kW2>(base_of, b - 100, tag, ys, rw);
  }
  stamp(3);
  end(launch, 0);
  stamp(4);
}

// Modes: 1 K-split loads only (100 CTAs); 2 K-split, 32 combiner CTAs of 80 columns (132 CTAs);
// 3 the same with W2 loaded first; 4 K-split, units 0..79 combine 32 columns each after their
// own work (100 CTAs); 5 the same without polls (wrong sums: the trip's cost). One CTA per SM.
__global__ void __launch_bounds__(512, 1) ksplit_structure(int mode, int launch, unsigned tag) {
  __shared__ float part[512];
  __shared__ float hs[16];
  __shared__ float ys[kRoutes * 80];
  __shared__ float rw[kRoutes];
  begin(launch);
  const char* const* base_of = c_base + launch * kRoutes;
  if (threadIdx.x < kRoutes) rw[threadIdx.x] = 0.1f * (threadIdx.x + 1);
  const int b = blockIdx.x;
  unsigned acc = 0;
  switch (mode) {
    case 1: {
      const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
      const char* w2 = base_of[b / 10] + kCodes13 + kMeta13;
      acc = w13_loads(base_of, b % 10, b / 10);
#pragma unroll
      for (int j = 0; j < 5; ++j) {
        const uint2 c = load_cs8(w2 + (5 * warp + j) * 2560 + (b % 10) * 256 + lane * 8);
        const char* m = w2 + kCodes2 + (b % 10 / 2) * 10240 + (160 * warp + lane + 32 * j) * 4;
        acc ^= c.x ^ c.y ^ __ldcs(reinterpret_cast<const unsigned*>(m));
      }
      break;
    }
    case 2:
    case 3:
      __syncthreads();  // rw
      if (b < 100) {
        if (mode == 2) {
          ksplit_unit<false>(base_of, b / 10, b % 10, tag, part, hs);
        } else {
          ksplit_unit<true>(base_of, b / 10, b % 10, tag, part, hs);
        }
      } else {
        ksplit_combine((b - 100) * 80, 80, tag, ys, rw);
      }
      break;
    case 4:
      __syncthreads();  // rw
      ksplit_unit<false>(base_of, b / 10, b % 10, tag, part, hs);
      if (b < 80) ksplit_combine(b * 32, 32, tag, ys, rw);
      break;
    default:
      __syncthreads();  // rw
      ksplit_unit<false>(base_of, b / 10, b % 10, tag, part, hs);
      if (b < 80) ksplit_combine<true>(b * 32, 32, tag, ys, rw);
  }
  stamp(3);
  end(launch, acc);
  stamp(4);
}

// The read floor's shape over the same ten regions (op_patterns.cu's floor_kernel).
__global__ void floor_shape(int launch) {
  begin(launch);
  end(launch, floor_chunk(c_base[launch * kRoutes + blockIdx.y], kRoute));
}

// Nothing but the span's stamps: the launch's own spread.
__global__ void empty_kernel(int launch) {
  begin(launch);
  end(launch, 0);
}

// Keeps every SM busy for `cycles` so that the clocks are up when the measured launches start.
__global__ void warm_up(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// The last launch's stamps: per step, min / median / max over the CTAs that stamped it, in us
// from the launch's first CTA start.
void* g_stamp_ptr() {
  void* p = nullptr;
  cudaGetSymbolAddress(&p, g_stamp);
  return p;
}
void print_stamps(int ctas, unsigned long long start) {
  static unsigned long long st[264][5];
  cudaMemcpyFromSymbol(st, g_stamp, sizeof(st));
  const char* names[5] = {"data in", "stores issued", "polls done", "before end", "end"};
  for (int k = 0; k < 5; ++k) {
    std::vector<double> v;
    for (int b = 0; b < ctas; ++b) {
      if (st[b][k] != 0) v.push_back((st[b][k] - start) / 1000.0);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("    %-14s n %3zu  min %5.2f  median %5.2f  max %5.2f\n", names[k], v.size(), v[0],
                v[v.size() / 2], v.back());
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, two_kernel_structure<8, true>, 512, 0);
  const long long bytes = 8ll << 30;
  char* buf = region_buffer(bytes);
  if (buf == nullptr) return 1;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<long long> pick(0, (bytes - kRoute) / 4096);
  struct Case {
    const char* name;
    int mode, ctas;
  };
  const Case cases[] = {
      {"read floor shape (480 x 256), 7.68 MB", -1, 0},
      {"two-kernel, bare (100 A + 160 B)", 0, 260},
      {"K-split loads only (100)", 1, 100},
      {"K-split, 32 combiner CTAs (132)", 2, 132},
      {"K-split, W2 first, 32 combiners (132)", 3, 132},
      {"K-split, units 0..79 combine (100)", 4, 100},
      {"K-split, units combine, no polls (100)", 5, 100},
      {"two-kernel, h in 4 copies", 6, 260},
      {"two-kernel, h in 8 copies", 7, 260},
      {"two-kernel, units B without W2 (diag)", 8, 260},
      {"two-kernel, no loads at all (diag)", 9, 260},
      {"empty grid of 260 x 512", 10, 260},
  };
  std::printf("# %s, %d SMs, %d two-kernel CTAs per SM; span median of 30, us\n", prop.name,
              prop.multiProcessorCount, per_sm);
  if (per_sm * prop.multiProcessorCount < 260) {
    std::printf("not every CTA would be resident: stop\n");
    return finish(buf);
  }
  unsigned tag = 0;
  for (int round = 0; round < 2; ++round) {
    for (const Case& c : cases) {
      const char* bases[kLaunches * kRoutes];
      for (const char*& b : bases) b = buf + pick(rng) * 4096;
      cudaMemcpyToSymbol(c_base, bases, sizeof(bases));
      static unsigned long long first[kLaunches], last[kLaunches], clk[kLaunches][4];
      std::fill(first, first + kLaunches, ~0ull);
      std::fill(last, last + kLaunches, 0ull);
      cudaMemcpyToSymbol(g_first, first, sizeof(first));
      cudaMemcpyToSymbol(g_last, last, sizeof(last));
      cudaMemset(g_stamp_ptr(), 0, sizeof(unsigned long long) * 264 * 5);
      warm_up<<<2 * prop.multiProcessorCount, 512>>>(8000000);  // about 4 ms
      for (int i = 0; i < kLaunches; ++i) {
        if (c.mode < 0) {
          const dim3 grid(static_cast<unsigned>((kRoute / 16 + 1023) / 1024), kRoutes);
          floor_shape<<<grid, 256>>>(i);
        } else if (c.mode == 0) {
          two_kernel_structure<1, true><<<c.ctas, 512>>>(i, ++tag);
        } else if (c.mode == 6) {
          two_kernel_structure<4, true><<<c.ctas, 512>>>(i, ++tag);
        } else if (c.mode == 7) {
          two_kernel_structure<8, true><<<c.ctas, 512>>>(i, ++tag);
        } else if (c.mode == 8) {
          two_kernel_structure<1, false><<<c.ctas, 512>>>(i, ++tag);
        } else if (c.mode == 9) {
          two_kernel_structure<1, false, false><<<c.ctas, 512>>>(i, ++tag);
        } else if (c.mode == 10) {
          empty_kernel<<<c.ctas, 512>>>(i);
        } else {
          ksplit_structure<<<c.ctas, 512>>>(c.mode, i, ++tag);
        }
      }
      cudaDeviceSynchronize();
      cudaMemcpyFromSymbol(first, g_first, sizeof(first));
      cudaMemcpyFromSymbol(last, g_last, sizeof(last));
      cudaMemcpyFromSymbol(clk, g_clk, sizeof(clk));
      std::vector<double> spans, mhz;
      for (int i = 2; i < kLaunches; ++i) {
        spans.push_back((last[i] - first[i]) / 1000.0);
        mhz.push_back(1e3 * (clk[i][2] - clk[i][0]) / static_cast<double>(clk[i][3] - clk[i][1]));
      }
      std::sort(spans.begin(), spans.end());
      std::sort(mhz.begin(), mhz.end());
      std::printf("%-42s %6.2f  (p10 %.2f, p90 %.2f)  SM %4.0f MHz\n", c.name,
                  spans[spans.size() / 2], spans[spans.size() / 10], spans[spans.size() * 9 / 10],
                  mhz[mhz.size() / 2]);
      if (c.mode >= 0 && round == 1) print_stamps(c.ctas, first[kLaunches - 1]);
    }
  }
  return finish(buf);
}
