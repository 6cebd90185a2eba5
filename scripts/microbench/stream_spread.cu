// How fast a fixed number of bytes streams from HBM depending on how it is spread over CTAs
// and SMs: kernel A of the operator streams its 5.12 MB of W13 from 100 CTAs of 512 threads
// (one per SM on 100 of an H200's 132 SMs), the read floor from ~470 CTAs of 256 threads.
// Each CTA reads one contiguous chunk, every thread issuing its L 16-byte streaming loads
// before using any; one launch per measurement, each on a region the previous launches did not
// touch (so nothing is served from L2). The kernel's span is read from %globaltimer (first CTA
// start to last CTA end), median over the launches.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/stream_spread.cu -o /tmp/stream_spread
//   /tmp/stream_spread
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "span.cuh"

template <int L>
__global__ void stream_kernel(const uint4* base, long long chunk16) {
  span_begin();
  const uint4* p = base + blockIdx.x * chunk16 + threadIdx.x;
  uint4 v[L];
#pragma unroll
  for (int i = 0; i < L; ++i) v[i] = __ldcs(p + i * blockDim.x);
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < L; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  span_end(acc);
}

struct Config {
  int ctas, threads, loads;
};

template <int L>
double span_us(const uint4* buf, long long buf16, const Config& c, int reps) {
  const long long chunk16 = static_cast<long long>(c.threads) * L;
  const long long total16 = chunk16 * c.ctas;
  std::vector<double> spans;
  long long off = 0;
  for (int r = 0; r < reps + 2; ++r) {
    if (off + total16 > buf16) off = 0;
    span_reset();
    stream_kernel<L><<<c.ctas, c.threads>>>(buf + off, chunk16);
    const double us = span_us();
    if (r >= 2) spans.push_back(us);
    off += total16 + 4096;  // a fresh region each launch
  }
  std::sort(spans.begin(), spans.end());
  return spans[spans.size() / 2];
}

double run(const uint4* buf, long long buf16, const Config& c, int reps) {
  switch (c.loads) {
    case 2: return span_us<2>(buf, buf16, c, reps);
    case 4: return span_us<4>(buf, buf16, c, reps);
    case 6: return span_us<6>(buf, buf16, c, reps);
    case 8: return span_us<8>(buf, buf16, c, reps);
    case 12: return span_us<12>(buf, buf16, c, reps);
    default: return -1.0;
  }
}

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const long long bytes = 8ll << 30;  // 8 GiB, 130x the L2
  char* mem = region_buffer(bytes);
  if (mem == nullptr) return 1;
  const uint4* buf = reinterpret_cast<const uint4*>(mem);
  const long long buf16 = bytes / 16;
  std::printf("# %s, %d SMs; span of one launch (first CTA start to last CTA end), median\n",
              prop.name, prop.multiProcessorCount);
  std::printf("%8s %8s %6s %10s %10s %10s %8s\n", "CTAs", "threads", "loads", "KB/CTA", "MB",
              "span us", "GB/s");
  const Config configs[] = {
      // 4.92 MB (kernel A's W13 is 5.12 MB): from 100 CTAs of 512 threads to many small ones
      {100, 512, 6}, {200, 256, 6}, {400, 128, 6}, {150, 512, 4}, {300, 256, 4},
      {600, 128, 4}, {1200, 128, 2}, {50, 512, 12}, {132, 512, 4}, {132, 256, 8},
      // 7.68 MB-ish (the whole op): the floor's shape and one CTA per SM
      {469, 256, 4}, {132, 512, 7 - 1}, {264, 256, 6}, {100, 512, 8}, {180, 512, 6},
  };
  for (const Config& c : configs) {
    const double us = run(buf, buf16, c, 30);
    const double mb = static_cast<double>(c.ctas) * c.threads * c.loads * 16 / 1e6;
    std::printf("%8d %8d %6d %10.1f %10.2f %10.2f %8.0f\n", c.ctas, c.threads, c.loads,
                c.threads * c.loads * 16 / 1024.0, mb, us, mb * 1e3 / us);
  }
  return finish(mem);
}
