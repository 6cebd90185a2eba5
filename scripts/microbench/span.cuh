// What the streaming microbenchmarks share: streaming 16- and 8-byte loads, relaxed 64-bit
// loads and stores, unit B's W2 loads, the read floor's per-CTA loads, and one launch's span
// from %globaltimer, the first CTA's start to the last CTA's end.
// span_begin at a kernel's start, span_end(acc) at its end (acc keeps the loads alive);
// span_reset before the launch and span_us after it on the host.

#pragma once

#include <cuda_runtime.h>

#include <cstdio>

__device__ unsigned long long g_start = ~0ull, g_end = 0ull;
__device__ unsigned g_sink;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A 16-byte streaming (evict-first) load; volatile, so it is issued where it is written.
__device__ __forceinline__ uint4 load_cs(const char* p) {
  uint4 v;
  asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// An 8-byte streaming load, volatile like load_cs.
__device__ __forceinline__ uint2 load_cs8(const char* p) {
  uint2 v;
  asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// A load's words folded into one (what keeps the loads alive without arithmetic).
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ unsigned fold(uint2 v) { return v.x ^ v.y; }
// Relaxed gpu-scope 64-bit load and store, as the operator's hand-off of h uses them.
__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// The read floor's shape (grid (chunks, route), 256 threads): thread t of CTA x loads 16 B at
// t, t + 256, t + 512 and t + 768 of the route region's 16 KB chunk x (`bytes` long in all)
// before using any; returns the words folded.
__device__ __forceinline__ unsigned floor_chunk(const char* region, long long bytes) {
  const uint4* p = reinterpret_cast<const uint4*>(region) + blockIdx.x * 1024;
  uint4 v[4];
  const int n = static_cast<int>(bytes / 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = blockIdx.x * 1024 + i * 256 + threadIdx.x;
    v[i] = k < n ? __ldcs(p + i * 256 + threadIdx.x) : make_uint4(0, 0, 0, 0);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc ^= fold(v[i]);
  return acc;
}
// One warp of the operator's unit B (16-column tile b): its route's 5 W2 groups as kernel B
// loads them (4 k-blocks x 16 columns of codes, 8 bytes per lane, and the group's 16 records, 8
// bytes per lane); codes2 / meta2 are the expert's W2 codes and 4-byte records. Returns the
// loaded words XOR-ed.
__device__ __forceinline__ unsigned load_unit_b_w2(const char* codes2, const char* meta2, int b,
                                                   int lane) {
  const char* codes = codes2 + (static_cast<long long>(b / 2) * 20 + (lane & 3)) * 128 +
                      (b & 1) * 64 + 8 * (lane >> 2);
  const char* meta = meta2 + (b * 16 + 2 * (lane >> 2)) * 4;
  uint2 v[10];
#pragma unroll
  for (int g = 0; g < 5; ++g) {
    v[2 * g] = load_cs8(codes + g * 4 * 128);
    v[2 * g + 1] = load_cs8(meta + g * 2560 * 4);
  }
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < 10; ++i) acc ^= v[i].x ^ v[i].y;
  return acc;
}
__device__ __forceinline__ void span_begin() {
  if (threadIdx.x == 0) atomicMin(&g_start, now_ns());
}
__device__ __forceinline__ void span_end(unsigned acc) {
  if (acc == 0x12345678u) g_sink = acc;
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&g_end, now_ns());
}

inline void span_reset() {
  const unsigned long long start = ~0ull, end = 0ull;
  cudaMemcpyToSymbol(g_start, &start, sizeof(start));
  cudaMemcpyToSymbol(g_end, &end, sizeof(end));
}
// After the launch: synchronizes, returns the span in us.
inline double span_us() {
  cudaDeviceSynchronize();
  unsigned long long start = 0, end = 0;
  cudaMemcpyFromSymbol(&start, g_start, sizeof(start));
  cudaMemcpyFromSymbol(&end, g_end, sizeof(end));
  return (end - start) / 1000.0;
}

// A buffer of `bytes` (set to ones) in which each launch picks regions the previous launches did
// not touch, so that nothing comes from L2; nullptr, after a message, if it cannot be had.
inline char* region_buffer(long long bytes) {
  char* buf = nullptr;
  if (cudaMalloc(&buf, bytes) != cudaSuccess) {
    std::printf("cudaMalloc failed\n");
    return nullptr;
  }
  cudaMemset(buf, 1, bytes);
  return buf;
}
// After the last launch: frees the buffer and reports a CUDA error; the process's exit code.
inline int finish(char* buf) {
  const cudaError_t err = cudaGetLastError();
  cudaFree(buf);
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
