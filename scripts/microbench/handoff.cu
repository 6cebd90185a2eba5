// How long does one value take from a store on one SM to a poll on another, through L2? The
// operator's hand-off of h is such a trip (a tagged 64-bit store, units B polling for the tag),
// and ksplit.cu measured the whole chain around it at about 1 us. Cases:
//
// - ping-pong: CTA 0 stores i to one word, CTA 1 waits for it and stores i to another word,
//   CTA 0 waits for that; 2,000 round trips, the one-way time is half of a round trip;
// - fan-out: CTA 0 stores a tag at a stamped time, `pollers` warps on the other SMs (one per
//   CTA, or 10 per CTA as kernel B's routes) each poll the word and stamp when they see it;
//   the max / median of (seen - stored) over the pollers, median of 50 trials.
//
// Relaxed gpu-scope 64-bit loads and stores, as the operator's poll_h / publish_h; no other
// traffic (the trip under the weight stream is slower: ksplit.cu).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/handoff.cu -o /tmp/handoff && /tmp/handoff
//
// A tuning tool, not part of the operator or its tests.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "span.cuh"

namespace {

constexpr int kRounds = 2000, kTrials = 50, kMaxPollers = 2048;

__device__ unsigned long long g_ping, g_pong;
__device__ __align__(128) unsigned long long g_word[32];  // word 0 polled; padding to a line
__device__ unsigned long long g_stored[kTrials], g_seen[kTrials][kMaxPollers], g_rtt;

__device__ __forceinline__ void wait_for(const unsigned long long* p, unsigned long long v) {
  unsigned polls = 0;
  while (ld_relaxed(p) != v) {
    if (++polls > (1u << 26)) __trap();
  }
}

// Two CTAs (blockDim 32); `base` makes every launch's values new.
__global__ void ping_pong(unsigned long long base) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 0) {
    wait_for(&g_pong, base);  // CTA 1 is up
    const unsigned long long t0 = now_ns();
    for (int i = 1; i <= kRounds; ++i) {
      st_relaxed(&g_ping, base + i);
      wait_for(&g_pong, base + i);
    }
    g_rtt = now_ns() - t0;
  } else {
    st_relaxed(&g_pong, base);
    for (int i = 1; i <= kRounds; ++i) {
      wait_for(&g_ping, base + i);
      st_relaxed(&g_pong, base + i);
    }
  }
}

// CTA 0 publishes after a pause (so that every poller is polling); CTAs 1.. poll with
// `warps` warps each (lane 0 of each warp polls, as a warp's poll is one request per line).
__global__ void fan_out(unsigned long long tag, int trial, int warps) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      const unsigned long long t0 = now_ns();
      while (now_ns() - t0 < 20000) {
      }
      g_stored[trial] = now_ns();
      st_relaxed(&g_word[0], tag);
    }
    return;
  }
  if (warp >= warps) return;
  unsigned long long v;
  do {
    v = __shfl_sync(0xffffffffu, lane == 0 ? ld_relaxed(&g_word[0]) : 0ull, 0);
  } while (v != tag);
  if (lane == 0) g_seen[trial][(blockIdx.x - 1) * warps + warp] = now_ns();
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("# %s, %d SMs; relaxed gpu-scope 64-bit stores and polls, us\n", prop.name,
              prop.multiProcessorCount);
  std::vector<double> one_way;
  for (int t = 0; t < 5; ++t) {
    ping_pong<<<2, 32>>>(1000000ull * (t + 1));
    cudaDeviceSynchronize();
    unsigned long long rtt = 0;
    cudaMemcpyFromSymbol(&rtt, g_rtt, sizeof(rtt));
    one_way.push_back(rtt / 1000.0 / kRounds / 2);
  }
  std::sort(one_way.begin(), one_way.end());
  std::printf("ping-pong between two SMs: one way %.3f us (5 launches: %.3f-%.3f)\n",
              one_way[2], one_way[0], one_way[4]);

  const int sms = prop.multiProcessorCount;
  struct Case {
    const char* name;
    int ctas, warps;
  };
  const Case cases[] = {
      {"1 poller", 1, 1},
      {"one warp on each other SM", sms - 1, 1},
      {"10 warps on each other SM (kernel B's routes)", sms - 1, 10},
  };
  unsigned long long tag = 1ull << 40;
  for (const Case& c : cases) {
    std::vector<double> med, mx;
    for (int trial = 0; trial < kTrials; ++trial) {
      fan_out<<<c.ctas + 1, 32 * c.warps>>>(++tag, trial, c.warps);
    }
    cudaDeviceSynchronize();
    static unsigned long long stored[kTrials], seen[kTrials][kMaxPollers];
    cudaMemcpyFromSymbol(stored, g_stored, sizeof(stored));
    cudaMemcpyFromSymbol(seen, g_seen, sizeof(seen));
    const int n = c.ctas * c.warps;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<double> d;
      for (int i = 0; i < n; ++i) d.push_back((seen[trial][i] - stored[trial]) / 1000.0);
      std::sort(d.begin(), d.end());
      med.push_back(d[d.size() / 2]);
      mx.push_back(d.back());
    }
    std::sort(med.begin(), med.end());
    std::sort(mx.begin(), mx.end());
    std::printf("fan-out, %-46s store -> seen: median %.3f us, last %.3f us\n", c.name,
                med[kTrials / 2], mx[kTrials / 2]);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
