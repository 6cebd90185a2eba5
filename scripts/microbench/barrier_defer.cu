// When does a warp's clock read placed right after __syncthreads() run: when the barrier
// releases, or as soon as the warp itself arrives? The operator's traces (since removed)
// stamp warp 0 right after kernel A's barrier and again after its first shared-memory load, and
// saw 0.55-0.8 us between the two. Here warp 0 arrives first and warps 1..15 spin ~SPIN cycles
// before the barrier; warp 0 reads %clock64 before the barrier, right after it, and after its
// first shared-memory load (the value as an operand, so the read waits for it).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/barrier_defer.cu -o /tmp/barrier_defer
//   /tmp/barrier_defer
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <cstdio>

__device__ long long g_out[4];

// The clock read issues after an add that needs `dep` (in-order issue), so after its load.
__device__ __forceinline__ long long clock_after(float dep, float& used) {
  long long c;
  asm volatile("add.f32 %0, %2, 0f3F800000;\n\tmov.u64 %1, %%clock64;"
               : "=f"(used), "=l"(c)
               : "f"(dep));
  return c;
}
__device__ __forceinline__ long long clock_now() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

__global__ void barrier_kernel(long long spin, float* out) {
  __shared__ float part[16 * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp != 0) {
    const long long until = clock_now() + spin;
    while (clock_now() < until) {
    }
  }
  part[warp * 32 + lane] = static_cast<float>(lane + warp);
  const long long before = clock_now();
  __syncthreads();
  const long long after = clock_now();
  if (warp == 0) {
    const float v = part[15 * 32 + lane];  // written by the last warp
    float used;
    const long long loaded = clock_after(v, used);
    out[lane] = used;
    if (lane == 0 && blockIdx.x == 0) {
      g_out[0] = before;
      g_out[1] = after;
      g_out[2] = loaded;
    }
  }
}

int main() {
  float* out = nullptr;
  cudaMalloc(&out, 32 * sizeof(float));
  std::printf("# warp 0 arrives first; warps 1..15 spin, then the barrier (cycles from warp 0's "
              "arrival)\n%10s %16s %22s\n", "spin", "read after bar", "after first LDS");
  for (long long spin : {0ll, 1000ll, 4000ll, 16000ll}) {
    long long h[4] = {};
    for (int rep = 0; rep < 5; ++rep) {
      barrier_kernel<<<1, 512>>>(spin, out);
      cudaDeviceSynchronize();
    }
    cudaMemcpyFromSymbol(h, g_out, sizeof(h));
    std::printf("%10lld %16lld %22lld\n", spin, h[1] - h[0], h[2] - h[0]);
  }
  cudaFree(out);
  return 0;
}
