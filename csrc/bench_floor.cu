// The read floor of the AWQ M1 op, and the small kernel the benchmark runs between layers. Part
// of the bench extension (qpnserve_bench, with bench_trace.cu), which `bench op` builds and loads
// beside the operator; the library a server loads has neither.
//
// `qpnserve bench op` times the op against `read_floor_m1`: a kernel that streams exactly the
// bytes the op must read (the ten routed experts' W13 and W2 weights and metadata, gathered by
// the same ids, either metadata format) and does nothing with them but a wrapping 32-bit sum,
// which keeps every load alive and lets the benchmark prove that each byte was read once.
// `derive_input_m1` is the dependent kernel between layers: it derives x from the previous
// layer's output and writes the layer's ids and router weights, as a model's router would, so
// no kernel may touch the weights before the previous layer is done reading.
//
// Reading order: device helpers, kernels, launchers, registration. The device part includes only
// awq_moe_m1_geometry.h (no includes of its own) so NVRTC can compile it for sm_70 (the V100
// model, tools/sm70proj); the host part is skipped under NVRTC. This file is compiled only into
// the bench extension, which needs CUDA (so does the benchmark). Both kernels are launched
// plainly, as the operator is (one cooperative launch, no programmatic dependent launch: sm_70
// has none).

#include "awq_moe_m1_geometry.h"

namespace qpnserve_floor {

// Contract section 2 and 3 geometry (awq_moe_m1_geometry.h), in 16-byte vectors per expert.
// Every per-expert block (int32 weights, 4-byte and 3-byte metadata alike) is a multiple of 16
// bytes, so each expert's four blocks can be streamed as whole 16-byte vectors with no tail.
constexpr int kNumExperts = qpn::kNumExperts;
constexpr int kTopK = qpn::kRoutes;
constexpr int kHidden = qpn::kHidden;
constexpr int kW13WeightVecs = qpn::kWords13 * 4 / 16;               // 25,600 (409,600 B)
constexpr int kW2WeightVecs = qpn::kWords2 * 4 / 16;                 // 12,800 (204,800 B)
constexpr int kS13Vecs4Byte = qpn::kGroups13 * qpn::kN13 * 4 / 16;   // 6,400 (102,400 B)
constexpr int kS2Vecs4Byte = qpn::kGroups2 * qpn::kHidden * 4 / 16;  // 3,200 (51,200 B)
constexpr int kS13Vecs3Byte = qpn::kGroups13 * qpn::kN13 * 3 / 16;   // 4,800 (76,800 B)
constexpr int kS2Vecs3Byte = qpn::kGroups2 * qpn::kHidden * 3 / 16;  // 2,400 (38,400 B)
static_assert((qpn::kGroups13 * qpn::kN13 * 3) % 16 == 0 &&
                  (qpn::kGroups2 * qpn::kHidden * 3) % 16 == 0,
              "3-byte metadata blocks are whole 16-byte vectors");
constexpr int kFloorThreads = 256;
constexpr int kDeriveThreads = kHidden / 8;  // one 16-byte vector of 8 halves per thread

struct Vec16 {
  unsigned a, b, c, d;
};

// Streaming 128-bit load (ld.global.cs, evict-first): every weight byte is used once, so it
// should not displace the small, reused tensors from the caches. LDG.E.128 on sm_70 and sm_90.
__device__ __forceinline__ Vec16 load_streaming(const Vec16* ptr) {
  Vec16 v;
  asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d)
      : "l"(ptr));
  return v;
}

// The same load with no L1 allocation and a 256-byte L2 prefetch (sm_80+; elsewhere the
// streaming load): fewer, larger DRAM requests may start the stream sooner.
__device__ __forceinline__ Vec16 load_prefetch256(const Vec16* ptr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  Vec16 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d)
      : "l"(ptr));
  return v;
#else
  return load_streaming(ptr);
#endif
}

template <int kHint>
__device__ __forceinline__ Vec16 load_vec(const Vec16* ptr) {
  return kHint == 1 ? load_prefetch256(ptr) : load_streaming(ptr);
}

__device__ __forceinline__ float half_bits_to_float(unsigned short bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}

__device__ __forceinline__ unsigned short float_to_half_bits(float f) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
  return bits;
}

__device__ __forceinline__ int chunks_of(int vecs, int per_block) {
  return (vecs + per_block - 1) / per_block;
}

// Grid (chunks, kTopK): blockIdx.y is the route; blockIdx.x picks one of the route's four
// segments (W13 weights, W13 metadata, W2 weights, W2 metadata, in that order; the choice is
// uniform across the CTA) and a contiguous chunk of kLoads * kFloorThreads vectors in it. Each
// thread issues its kLoads loads before the first use, so a CTA has kLoads * 4 KiB in flight.
//
// sink:   (>= gridDim.x * gridDim.y * kFloorThreads / 32,) uint32, one wrapping sum per warp
// w13:    (512, 2560, 40) int32 as 16-byte vectors;  s13: (512, 80, 320) int32 or (..., 3) uint8
// w2:     (512, 160, 320) int32 as 16-byte vectors;   s2:  (512, 5, 2560) int32 or (..., 3) uint8
// ids:    (1, 10) int32; an id outside [0, 512) reads nothing, as in the op
template <int kLoads, int kHint = 0>
__global__ void __launch_bounds__(kFloorThreads)
    read_floor_m1_kernel(unsigned* __restrict__ sink, const Vec16* __restrict__ w13,
                         const Vec16* __restrict__ s13, const Vec16* __restrict__ w2,
                         const Vec16* __restrict__ s2, const int* __restrict__ ids,
                         int s13_vecs, int s2_vecs) {
  constexpr int kPerBlock = kLoads * kFloorThreads;
  const int expert = ids[blockIdx.y];
  unsigned sum = 0;
  if (expert >= 0 && expert < kNumExperts) {
    const int chunks_w13 = chunks_of(kW13WeightVecs, kPerBlock);
    const int chunks_s13 = chunks_of(s13_vecs, kPerBlock);
    const int chunks_w2 = chunks_of(kW2WeightVecs, kPerBlock);
    int chunk = blockIdx.x;
    const Vec16* base;
    int len;
    if (chunk < chunks_w13) {
      base = w13 + static_cast<long long>(expert) * kW13WeightVecs;
      len = kW13WeightVecs;
    } else if ((chunk -= chunks_w13) < chunks_s13) {
      base = s13 + static_cast<long long>(expert) * s13_vecs;
      len = s13_vecs;
    } else if ((chunk -= chunks_s13) < chunks_w2) {
      base = w2 + static_cast<long long>(expert) * kW2WeightVecs;
      len = kW2WeightVecs;
    } else {
      chunk -= chunks_w2;
      base = s2 + static_cast<long long>(expert) * s2_vecs;
      len = s2_vecs;
    }
    const int first = chunk * kPerBlock + threadIdx.x;
    Vec16 v[kLoads];
    if ((chunk + 1) * kPerBlock <= len) {
      // A full chunk (all but the last of each segment): no predicates, so ptxas issues all
      // kLoads loads back to back before the first add.
#pragma unroll
      for (int u = 0; u < kLoads; ++u) v[u] = load_vec<kHint>(base + first + u * kFloorThreads);
    } else {
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = first + u * kFloorThreads;
        v[u] = i < len ? load_vec<kHint>(base + i) : Vec16{0u, 0u, 0u, 0u};
      }
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) sum += v[u].a + v[u].b + v[u].c + v[u].d;
  }
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, lane_mask);
  }
  if ((threadIdx.x & 31) == 0) {
    const int block = blockIdx.y * gridDim.x + blockIdx.x;
    sink[block * (kFloorThreads / 32) + threadIdx.x / 32] = sum;
  }
}

// One CTA of 320 threads, 8 halves each:
//   x_next[k] = fp16(seed[k] + 0.125 * clamp(float(out_prev[k]), -8, 8))   (1, 2560) fp16
//   ids_next = ids_src (1, 10) int32;  weights_next = weights_src (1, 10) fp32
// The clamp keeps x bounded over many chained layers of random weights.
__global__ void __launch_bounds__(kDeriveThreads)
    derive_input_m1_kernel(Vec16* __restrict__ x_next, int* __restrict__ ids_next,
                           float* __restrict__ weights_next, const Vec16* __restrict__ out_prev,
                           const Vec16* __restrict__ seed, const int* __restrict__ ids_src,
                           const float* __restrict__ weights_src) {
  const int t = threadIdx.x;
  const Vec16 o = out_prev[t];
  const Vec16 s = seed[t];
  const unsigned o_words[4] = {o.a, o.b, o.c, o.d};
  const unsigned s_words[4] = {s.a, s.b, s.c, s.d};
  unsigned x_words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    unsigned word = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int shift = 16 * half;
      const float prev = half_bits_to_float(static_cast<unsigned short>(o_words[w] >> shift));
      const float base = half_bits_to_float(static_cast<unsigned short>(s_words[w] >> shift));
      const float clamped = fminf(fmaxf(prev, -8.0f), 8.0f);
      const unsigned short x = float_to_half_bits(base + 0.125f * clamped);
      word |= static_cast<unsigned>(x) << shift;
    }
    x_words[w] = word;
  }
  x_next[t] = Vec16{x_words[0], x_words[1], x_words[2], x_words[3]};
  if (t < kTopK) {
    ids_next[t] = ids_src[t];
    weights_next[t] = weights_src[t];
  }
}

// Explicit instantiations, so a device-only compile (NVRTC for the sm_70 projection) emits
// every variant the launcher can pick.
#define QPNSERVE_FLOOR_INSTANTIATE(LOADS, HINT)                                               \
  template __global__ void read_floor_m1_kernel<LOADS, HINT>(                                \
      unsigned* __restrict__, const Vec16* __restrict__, const Vec16* __restrict__,          \
      const Vec16* __restrict__, const Vec16* __restrict__, const int* __restrict__, int, int);
#define QPNSERVE_FLOOR_INSTANTIATE_LOADS(HINT) \
  QPNSERVE_FLOOR_INSTANTIATE(2, HINT)          \
  QPNSERVE_FLOOR_INSTANTIATE(4, HINT)          \
  QPNSERVE_FLOOR_INSTANTIATE(8, HINT)          \
  QPNSERVE_FLOOR_INSTANTIATE(16, HINT)
QPNSERVE_FLOOR_INSTANTIATE_LOADS(0)
QPNSERVE_FLOOR_INSTANTIATE_LOADS(1)
#undef QPNSERVE_FLOOR_INSTANTIATE_LOADS
#undef QPNSERVE_FLOOR_INSTANTIATE

}  // namespace qpnserve_floor

#if !defined(__CUDACC_RTC__) && !defined(QPNSERVE_DEVICE_ONLY)

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <cstdint>

#include "message_text.h"

namespace qpnserve_floor {
namespace {

void check_cuda_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                       at::IntArrayRef shape, const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == device, name, " must be on ", qpn_text::device(device), ", got ",
              qpn_text::device(t.device()));
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, name, " must have shape ", qpn_text::shape(shape), ", got ",
              qpn_text::shape(t.sizes()));
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_aligned16(const at::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must be 16-byte aligned");
}

template <int kLoads>
void launch_floor(int64_t hint, dim3 grid, cudaStream_t stream, unsigned* sink, const Vec16* w13,
                  const Vec16* s13, const Vec16* w2, const Vec16* s2, const int* ids,
                  int s13_vecs, int s2_vecs) {
  if (hint == 1) {
    read_floor_m1_kernel<kLoads, 1><<<grid, kFloorThreads, 0, stream>>>(sink, w13, s13, w2, s2,
                                                                        ids, s13_vecs, s2_vecs);
  } else {
    read_floor_m1_kernel<kLoads, 0><<<grid, kFloorThreads, 0, stream>>>(sink, w13, s13, w2, s2,
                                                                        ids, s13_vecs, s2_vecs);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Chunks (CTAs) per route over the four segments, or over the two of W13 (w13_only: the tuning
// mode cache_hint 2).
int64_t floor_chunks_per_route(int64_t loads_per_thread, int s13_vecs, int s2_vecs,
                               bool w13_only = false) {
  const int64_t per_block = loads_per_thread * kFloorThreads;
  const int64_t segments[4] = {kW13WeightVecs, s13_vecs, kW2WeightVecs, s2_vecs};
  int64_t chunks = 0;
  for (int i = 0; i < (w13_only ? 2 : 4); ++i) chunks += (segments[i] + per_block - 1) / per_block;
  return chunks;
}

}  // namespace

// Number of uint32 partial sums read_floor_m1 writes (one per warp) for loads_per_thread;
// qpnserve/benchop/route_bytes.py computes the same number for the caller's allocation.
int64_t read_floor_m1_sink_len(int64_t loads_per_thread, bool three_byte) {
  const int s13_vecs = three_byte ? kS13Vecs3Byte : kS13Vecs4Byte;
  const int s2_vecs = three_byte ? kS2Vecs3Byte : kS2Vecs4Byte;
  return floor_chunks_per_route(loads_per_thread, s13_vecs, s2_vecs) * kTopK *
         (kFloorThreads / 32);
}

void read_floor_m1(at::Tensor& sink, const at::Tensor& w13, const at::Tensor& s13,
                   const at::Tensor& w2, const at::Tensor& s2, const at::Tensor& ids,
                   int64_t loads_per_thread, int64_t cache_hint) {
  TORCH_CHECK(cache_hint == 0 || cache_hint == 1 || cache_hint == 2,
              "cache_hint must be 0 (ld.global.cs), 1 (L1 no-allocate, L2 256 B prefetch) or 2 "
              "(tuning runs: ld.global.cs of the W13 segments only), got ",
              qpn_text::num(cache_hint));
  TORCH_CHECK(loads_per_thread == 2 || loads_per_thread == 4 || loads_per_thread == 8 ||
                  loads_per_thread == 16,
              "loads_per_thread must be 2, 4, 8 or 16, got ", qpn_text::num(loads_per_thread));
  const at::Device device = w13.device();
  const bool three_byte = s13.scalar_type() == at::kByte;
  using qpn::kGroups13, qpn::kGroups2, qpn::kInter, qpn::kN13;
  check_cuda_tensor(w13, "w13", at::kInt, {kNumExperts, kHidden, kN13 / 8}, device);
  check_cuda_tensor(w2, "w2", at::kInt, {kNumExperts, kInter, kHidden / 8}, device);
  if (three_byte) {
    check_cuda_tensor(s13, "s13", at::kByte, {kNumExperts, kGroups13, kN13, 3}, device);
    check_cuda_tensor(s2, "s2", at::kByte, {kNumExperts, kGroups2, kHidden, 3}, device);
  } else {
    check_cuda_tensor(s13, "s13", at::kInt, {kNumExperts, kGroups13, kN13}, device);
    check_cuda_tensor(s2, "s2", at::kInt, {kNumExperts, kGroups2, kHidden}, device);
  }
  check_cuda_tensor(ids, "ids", at::kInt, {1, kTopK}, device);
  TORCH_CHECK(sink.is_cuda() && sink.device() == device, "sink must be on ",
              qpn_text::device(device));
  TORCH_CHECK(sink.scalar_type() == at::kInt && sink.dim() == 1 && sink.is_contiguous(),
              "sink must be a contiguous 1-d int32 tensor");
  TORCH_CHECK(sink.numel() >= read_floor_m1_sink_len(loads_per_thread, three_byte),
              "sink must hold at least ",
              qpn_text::num(read_floor_m1_sink_len(loads_per_thread, three_byte)),
              " elements for loads_per_thread=", qpn_text::num(loads_per_thread));
  check_aligned16(w13, "w13");
  check_aligned16(s13, "s13");
  check_aligned16(w2, "w2");
  check_aligned16(s2, "s2");
  const c10::cuda::CUDAGuard guard(device);
  const int s13_vecs = three_byte ? kS13Vecs3Byte : kS13Vecs4Byte;
  const int s2_vecs = three_byte ? kS2Vecs3Byte : kS2Vecs4Byte;
  const dim3 grid(static_cast<unsigned>(
                      floor_chunks_per_route(loads_per_thread, s13_vecs, s2_vecs, cache_hint == 2)),
                  kTopK);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  auto* sink_ptr = reinterpret_cast<unsigned*>(sink.data_ptr<int>());
  auto* w13_ptr = reinterpret_cast<const Vec16*>(w13.data_ptr());
  auto* s13_ptr = reinterpret_cast<const Vec16*>(s13.data_ptr());
  auto* w2_ptr = reinterpret_cast<const Vec16*>(w2.data_ptr());
  auto* s2_ptr = reinterpret_cast<const Vec16*>(s2.data_ptr());
  const int* ids_ptr = ids.data_ptr<int>();
  auto run = [&](auto launcher) {
    launcher(cache_hint, grid, stream, sink_ptr, w13_ptr, s13_ptr, w2_ptr, s2_ptr, ids_ptr,
             s13_vecs, s2_vecs);
  };
  switch (loads_per_thread) {
    case 2: run(launch_floor<2>); break;
    case 4: run(launch_floor<4>); break;
    case 8: run(launch_floor<8>); break;
    default: run(launch_floor<16>); break;  // 16: the only value left after the check above
  }
}

void derive_input_m1(at::Tensor& x_next, at::Tensor& ids_next, at::Tensor& weights_next,
                     const at::Tensor& out_prev, const at::Tensor& seed,
                     const at::Tensor& ids_src, const at::Tensor& weights_src) {
  const at::Device device = x_next.device();
  check_cuda_tensor(x_next, "x_next", at::kHalf, {1, kHidden}, device);
  check_cuda_tensor(out_prev, "out_prev", at::kHalf, {1, kHidden}, device);
  check_cuda_tensor(seed, "seed", at::kHalf, {1, kHidden}, device);
  check_cuda_tensor(ids_next, "ids_next", at::kInt, {1, kTopK}, device);
  check_cuda_tensor(ids_src, "ids_src", at::kInt, {1, kTopK}, device);
  check_cuda_tensor(weights_next, "weights_next", at::kFloat, {1, kTopK}, device);
  check_cuda_tensor(weights_src, "weights_src", at::kFloat, {1, kTopK}, device);
  check_aligned16(x_next, "x_next");
  check_aligned16(out_prev, "out_prev");
  check_aligned16(seed, "seed");
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  derive_input_m1_kernel<<<1, kDeriveThreads, 0, stream>>>(
      reinterpret_cast<Vec16*>(x_next.data_ptr()), ids_next.data_ptr<int>(),
      weights_next.data_ptr<float>(), reinterpret_cast<const Vec16*>(out_prev.data_ptr()),
      reinterpret_cast<const Vec16*>(seed.data_ptr()), ids_src.data_ptr<int>(),
      weights_src.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpnserve_floor

// The bench extension's library (qpnserve_bench, built by `bench op`, never loaded by a
// server); bench_trace.cu adds its fragment.
TORCH_LIBRARY(qpnserve_bench, m) {
  m.def(
      "read_floor_m1(Tensor(a!) sink, Tensor w13, Tensor s13, Tensor w2, Tensor s2, "
      "Tensor ids, int loads_per_thread=8, int cache_hint=0) -> ()");
  m.def(
      "derive_input_m1(Tensor(a!) x_next, Tensor(b!) ids_next, Tensor(c!) weights_next, "
      "Tensor out_prev, Tensor seed, Tensor ids_src, Tensor weights_src) -> ()");
}

TORCH_LIBRARY_IMPL(qpnserve_bench, CUDA, m) {
  m.impl("read_floor_m1", &qpnserve_floor::read_floor_m1);
  m.impl("derive_input_m1", &qpnserve_floor::derive_input_m1);
}

#endif  // host part
