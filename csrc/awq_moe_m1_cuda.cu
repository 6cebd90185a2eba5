// CUDA launcher of qpnserve::awq_moe_m1_out: argument checks, device guard, current stream,
// two launches (kernel B with programmatic dependent launch on sm_90), launch checks. No
// allocation and no host synchronisation, so it is capturable in a CUDA graph.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <array>
#include <mutex>

#include "awq_moe_m1_checks.h"
#include "awq_moe_m1_kernels.cuh"
#include "awq_moe_m1_sm70_launch.h"
#include "pdl_launch.h"

namespace qpnserve {
namespace {

enum Path : int64_t { kAuto = 0, kMma16816 = 1, kMma884 = 2, kV100Design = 3 };

// Whether kernel B's device code for this GPU contains griddepcontrol (built for sm_90+). A build
// that only carries older code must not be launched with the programmatic attribute, because
// its kernel B would read h without waiting. Cached per device; the query does not synchronise.
template <typename Kernel>
bool binary_has_pdl(Kernel kernel, int device) {
  static std::mutex mu;
  static std::array<int, 64> cache{};  // 0 unknown, 1 no, 2 yes
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= static_cast<int>(cache.size())) return false;
  if (cache[device] == 0) {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    cache[device] = attr.binaryVersion >= 90 ? 2 : 1;
  }
  return cache[device] == 2;
}

// Path argument: bits 0-1 select the inner product (Path); the higher bits are tuning
// diagnostics that `scripts/op_timing.py` uses to split the time (never set by callers).
constexpr int64_t kPathMask = 3;
constexpr int64_t kDiagSkipB = 4;        // launch kernel A only
constexpr int64_t kDiagSkipA = 8;        // launch kernel B only
constexpr int64_t kDiagNoPdl = 16;       // plain launches even on sm_90
constexpr int64_t kDiagLaunchOnly = 32;  // kernels exit after reading ids
constexpr int64_t kDiagWarpsShift = 6;   // bits 6-7: kernel A warps (m16n8k16): 0 default 16,
                                         // 1 -> 8, 2 -> 10, 3 -> 20
constexpr int64_t kTwoKernels = 256;     // the two-kernel form even where the fused one fits
constexpr int64_t kForceFused = 512;     // the fused form wherever it fits
constexpr int64_t kDiagNoPrefetch = 1024;  // kernel A does not prefetch W2 into L2
constexpr int64_t kDiagBDequantLate = 2048;  // kernel B dequantizes W2 after the wait even with PDL
constexpr int64_t kForceSplit = 4096;        // the split form (kernels A + C) on any sm_80+
constexpr int64_t kDiagLoadOnlyA = 8192;     // kernel A skips its arithmetic (wrong h)
constexpr int64_t kDiagRolledSums = 16384;   // split form: the partial sums as a rolled loop
constexpr int64_t kDiagBare = 32768;         // with kDiagLoadOnlyA, split form: loads and exit
constexpr int64_t kDiagStreamOnlyA = kDiagLoadOnlyA | kDiagBare;
// bits 18-20: the two-kernel form's kernel B (sm_90, PDL) holds its W2 loads back 250 ns x that
constexpr int64_t kDiagBDelayShift = 18;
constexpr int64_t kDiagBDelayMask = int64_t{7} << kDiagBDelayShift;
// two-kernel form (sm_90, PDL): kernel A prefetches W2 once its W13 has landed, kernel B loads
// W2 after its wait
constexpr int64_t kDiagLateW2 = int64_t{1} << 21;
// two-kernel form (sm_90, PDL): the polled hand-off of h (kernel A publishes h with the call's
// tag, kernel B polls it instead of waiting for kernel A's completion; A does not prefetch W2)
constexpr int64_t kDiagPolled = int64_t{1} << 22;
// with the polled hand-off: kernel B does not wait for kernel A's completion at its end (tuning
// runs only: it measures what that wait costs)
constexpr int64_t kDiagNoEndWait = int64_t{1} << 23;
// sm_90 with PDL (tuning runs): the fused polled form, one launch (fused_polled_kernel), where
// all its CTAs can be resident; elsewhere the call takes the default path
constexpr int64_t kForceFusedPolled = int64_t{1} << 26;
// with the polled hand-off (tuning runs): kernel B of 32-column tiles, 80 CTAs
// (w2_combine_capped_kernel, the default until commit 563dae8's run) instead of 160 of 16
constexpr int64_t kDiagB32 = int64_t{1} << 27;
// with the polled hand-off (tuning runs): the 16-column kernel B dequantizes W2 after the poll
constexpr int64_t kDiagB16Late = int64_t{1} << 28;
// with the polled hand-off (tuning runs): the 16-column kernel B's MMAs in one accumulator (its
// sums bit for bit the waiting kernel B's) instead of two
constexpr int64_t kDiagB16OneChain = int64_t{1} << 29;
// with the polled hand-off (tuning runs): the 16-column kernel B's MMAs in five accumulators
constexpr int64_t kDiagB16FiveChains = int64_t{1} << 30;
// with the polled hand-off (tuning runs): the 16-column kernel B without its arithmetic (no
// dequantization, no MMAs; the output meaningless), to time what that arithmetic costs
constexpr int64_t kDiagB16LoadOnly = int64_t{1} << 31;
// The bits that pin the two-kernel form with kernel B waiting for kernel A's completion (or a
// tuning variant of it); without any of them, PATH_AUTO takes the polled hand-off on sm_90.
constexpr int64_t kWaitingFormBits = kTwoKernels | (int64_t{3} << kDiagWarpsShift) |
                                     kDiagLoadOnlyA | kDiagBDequantLate | kDiagBDelayMask |
                                     kDiagLateW2;
constexpr int64_t kDiagBits = kDiagSkipB | kDiagSkipA | kDiagNoPdl | kDiagLaunchOnly |
                              (int64_t{3} << kDiagWarpsShift) | kTwoKernels | kForceFused |
                              kDiagNoPrefetch | kDiagBDequantLate | kForceSplit | kDiagLoadOnlyA |
                              kDiagRolledSums | kDiagBare | kDiagBDelayMask | kDiagLateW2 |
                              kDiagPolled | kDiagNoEndWait | kForceFusedPolled | kDiagB32 |
                              kDiagB16Late | kDiagB16OneChain | kDiagB16FiveChains |
                              kDiagB16LoadOnly;
// Which form PATH_AUTO takes on sm_80+, by the H200 measurements: the two-kernel form (on sm_90
// with PDL its polled hand-off of h: `qpnserve bench op`, 32 layers, 4-byte, commit f848f9a,
// 5.43 us/layer net against 6.73 for the split form and 6.66 for kernel B waiting for kernel
// A's completion); the fused form (scripts/op_timing.py, 8 layers, commit 2f89565) 9.30 against
// 6.94 for two kernels: its counter hand-off costs more than the kernel boundary it removes.
// The fused and split forms stay available (PATH_FUSED, PATH_SPLIT).
constexpr bool kPreferFused = false;

// Whether all `ctas` CTAs of a fused kernel can be resident at once on this device (then a unit
// B spinning on what units A publish can never hold a slot a unit A needs). `cache` is the
// kernel's own: 0 unknown, 1 no, 2 yes, per device.
bool all_resident(const void* kernel, int threads, int ctas, int device,
                  std::array<int, 64>& cache) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= static_cast<int>(cache.size())) return false;
  if (cache[device] == 0) {
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    const int sms = at::cuda::getDeviceProperties(device)->multiProcessorCount;
    cache[device] = per_sm * sms >= ctas ? 2 : 1;
  }
  return cache[device] == 2;
}
template <bool kMeta3>
bool fused_fits(int device) {
  static std::array<int, 64> cache{};
  return all_resident(reinterpret_cast<const void*>(qpn::fused_moe_kernel<kMeta3>),
                      qpn::kFusedWarps * 32, qpn::kFusedCtas, device, cache);
}
template <bool kMeta3>
bool fused_polled_fits(int device) {
  static std::array<int, 64> cache{};
  return all_resident(reinterpret_cast<const void*>(qpn::fused_polled_kernel<kMeta3>),
                      qpn::kFusedPolledWarps * 32, qpn::kFusedCtas, device, cache);
}

// The device address of a __device__ object of this module (the split form's shares, the
// polled hand-off's words), looked up once per device and object; the kernels take it as an
// argument (awq_moe_m1_split.cuh says why). Needs the device guard of the caller.
using AddressCache = std::array<void*, 64>;
void* symbol_address(const void* symbol, AddressCache& cache, int device) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  TORCH_CHECK(device >= 0 && device < static_cast<int>(cache.size()),
              "awq_moe_m1_out: device index out of range");
  if (cache[device] == nullptr) C10_CUDA_CHECK(cudaGetSymbolAddress(&cache[device], symbol));
  return cache[device];
}
float* y_part_address(int device) {
  static AddressCache cache{};
  return static_cast<float*>(symbol_address(&qpn::g_y_part, cache, device));
}
qpn::PolledH* polled_address(int device) {
  static AddressCache cache{};
  return static_cast<qpn::PolledH*>(symbol_address(&qpn::g_polled_h, cache, device));
}

// The split form: kernel A (W13, SwiGLU and the matching 16 rows of W2) then kernel C (the
// shares' sum and the route combine), both programmatic dependents where the binary has PDL.
template <bool kMeta3>
void launch_split(const qpn::MoeArgs& args, cudaStream_t stream, int device, int cc_major,
                  int64_t diag) {
  constexpr int kBare = qpn::kSplitLoadOnly | qpn::kSplitBare;
  const bool stream_only = (diag & kDiagStreamOnlyA) == kDiagStreamOnlyA;
  auto* kernel_a = stream_only                ? qpn::split_a_kernel<kMeta3, kBare>
                   : (diag & kDiagLoadOnlyA)  ? qpn::split_a_kernel<kMeta3, qpn::kSplitLoadOnly>
                   : (diag & kDiagRolledSums) ? qpn::split_a_kernel<kMeta3, qpn::kSplitRolled>
                                              : qpn::split_a_kernel<kMeta3, 0>;
  auto* kernel_c = qpn::combine_split_kernel;
  qpn::MoeArgs a = args;
  a.y_part = y_part_address(device);
  const bool use_pdl = cc_major >= 9 && (diag & kDiagNoPdl) == 0 &&
                       binary_has_pdl(kernel_a, device) && binary_has_pdl(kernel_c, device);
  if ((diag & kDiagSkipA) == 0) {
    qpn_launch::launch(kernel_a, dim3(qpn::kTiles13, qpn::kRoutes), dim3(qpn::kSplitWarps * 32),
                       use_pdl, stream, a);
  }
  if ((diag & kDiagSkipB) == 0) {
    qpn_launch::launch(kernel_c, dim3(qpn::kTiles2), dim3(qpn::kRoutes * 32), use_pdl, stream, a);
  }
}

template <bool kMeta3, bool kUse884>
void launch(const qpn::MoeArgs& args, cudaStream_t stream, int device, int cc_major,
            int64_t diag) {
  if constexpr (!kUse884) {
    // The split form only where pinned (PATH_SPLIT): the polled two-kernel form is faster.
    const bool want_split = (diag & kForceSplit) != 0;
    if (want_split) {
      launch_split<kMeta3>(args, stream, device, cc_major, diag);
      return;
    }
    // Pinned (tuning runs): the fused polled form where it has PDL and all its CTAs fit.
    auto* fused_polled = qpn::fused_polled_kernel<kMeta3>;
    if ((diag & kForceFusedPolled) != 0 && cc_major >= 9 && (diag & kDiagNoPdl) == 0 &&
        binary_has_pdl(fused_polled, device) && fused_polled_fits<kMeta3>(device)) {
      qpn::MoeArgs a = args;
      a.polled = polled_address(device);
      a.diag |= qpn::kDiagNoW2Prefetch;
      qpn_launch::launch(fused_polled, dim3(qpn::kFusedCtas), dim3(qpn::kFusedPolledWarps * 32),
                         true, stream, a);
      return;
    }
  }
  const bool want_fused = !kUse884 && (diag == kForceFused || (diag == 0 && kPreferFused));
  if (want_fused && fused_fits<kMeta3>(device)) {
    auto* kernel = qpn::fused_moe_kernel<kMeta3>;
    const bool pdl = cc_major >= 9 && binary_has_pdl(kernel, device);
    qpn_launch::launch(kernel, dim3(qpn::kFusedCtas), dim3(qpn::kFusedWarps * 32), pdl, stream,
                       args);
    return;
  }
  // Both kernels are launched as programmatic dependents on sm_90: A waits for its
  // predecessor (griddepcontrol.wait) before reading ids and x; B polls h as A publishes it (or,
  // pinned, waits for A's completion before reading h). With PDL, B loads and dequantizes its W2
  // meanwhile; on sm_90 (m16n8k16) A at 64 registers and B capped at 80 so that every B CTA is
  // resident beside A from the start (two_kernel.cuh).
  const bool use_pdl =
      cc_major >= 9 && (diag & kDiagNoPdl) == 0 &&
      binary_has_pdl(qpn::w2_combine_kernel<kMeta3, kUse884, qpn::kGroups2>, device);
  qpn::MoeArgs a = args;
  auto* kernel_a = qpn::w13_swiglu_kernel<kMeta3, kUse884>;
  auto* kernel_b = use_pdl ? qpn::w2_combine_kernel<kMeta3, kUse884, qpn::kGroups2>
                           : qpn::w2_combine_kernel<kMeta3, kUse884, 0>;
  int warps_a = qpn::warps_a(kUse884);
  int ctas_b = qpn::kTiles2;
  if (!kUse884) {
    if (use_pdl) {
      kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 16, false, 2>;
      kernel_b = (diag & kDiagBDelayMask) != 0
                     ? qpn::w2_combine_capped_kernel<kMeta3, qpn::kW2Delayed>
                     : qpn::w2_combine_capped_kernel<kMeta3>;
      if (diag & kDiagLateW2) {
        kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 16, false, QPN_A_MIN_BLOCKS, true>;
        kernel_b = qpn::w2_combine_capped_kernel<kMeta3, qpn::kW2AfterWait>;
      }
    }
    switch ((diag >> kDiagWarpsShift) & 3) {
      case 1: kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 8>; warps_a = 8; break;
      case 2: kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 10>; warps_a = 10; break;
      case 3: kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 20>; warps_a = 20; break;
      default: break;
    }
    if (diag & kDiagLoadOnlyA) kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 16, true>;
  }
  if (diag & kDiagBDequantLate) kernel_b = qpn::w2_combine_kernel<kMeta3, kUse884, 0>;
  if constexpr (!kUse884) {
    // The polled hand-off (the default with PDL; pinned by kDiagPolled over the waiting form's
    // bits): kernel B polls what kernel A publishes, so both must run (never with kDiagSkipA).
    const bool polled = (diag & kDiagPolled) != 0 || (diag & kWaitingFormBits) == 0;
    if (use_pdl && polled && (diag & kDiagSkipA) == 0) {
      kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 16, false, 2, false, qpn::kPublishTag>;
      kernel_b = (diag & kDiagNoEndWait) != 0
                     ? qpn::w2_combine_capped_kernel<kMeta3, qpn::kW2AtStart, qpn::kPolledNoEndWait>
                     : qpn::w2_combine_capped_kernel<kMeta3, qpn::kW2AtStart, qpn::kPolledThenWait>;
      // Kernel B of 16-column tiles (160 CTAs): bench op on the H200, commit 563dae8, 5.22 /
      // 5.48 us net (4-byte / 3-byte) against 5.43 / 5.76 for 80 CTAs of 32 columns.
      if ((diag & kDiagB32) == 0) {
        kernel_b = (diag & kDiagB16Late) != 0         ? qpn::w2_combine16_kernel<kMeta3, true, 1>
                   : (diag & kDiagB16OneChain) != 0   ? qpn::w2_combine16_kernel<kMeta3, false, 1>
                   : (diag & kDiagB16FiveChains) != 0 ? qpn::w2_combine16_kernel<kMeta3, false, 5>
                   : (diag & kDiagB16LoadOnly) != 0
                       ? qpn::w2_combine16_kernel<kMeta3, false, 2, true>
                       : qpn::w2_combine16_kernel<kMeta3>;
        ctas_b = qpn::kTiles2x16;
      }
      // Tuning runs: the polled form with kernel A's arithmetic skipped (h meaningless), to
      // time what that arithmetic costs inside the op.
      if (diag & kDiagLoadOnlyA) {
        kernel_a = qpn::w13_swiglu_kernel<kMeta3, false, 16, true, 2, false, qpn::kPublishTag>;
      }
      warps_a = 16;
      a.polled = polled_address(device);
      a.diag |= qpn::kDiagNoW2Prefetch;
    }
  }
  if ((diag & kDiagSkipA) == 0) {
    qpn_launch::launch(kernel_a, dim3(qpn::kTiles13, qpn::kRoutes), dim3(warps_a * 32), use_pdl,
                       stream, a);
  }
  if ((diag & kDiagSkipB) == 0) {
    qpn_launch::launch(kernel_b, dim3(ctas_b), dim3(qpn::kWarpsB * 32), use_pdl, stream, a);
  }
}

void awq_moe_m1_out_path_cuda(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                              const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                              const at::Tensor& s2, const at::Tensor& ids,
                              const at::Tensor& weights, int64_t path) {
  TORCH_CHECK(out.is_cuda(), "awq_moe_m1_out: out must be a CUDA tensor");
  const MetaFormat format = check_args(out, intermediate, x, w13, s13, w2, s2, ids, weights);
  const int64_t diag = path & kDiagBits;
  TORCH_CHECK((path & ~(kPathMask | kDiagBits)) == 0 &&
                  ((path & kPathMask) != kV100Design || diag == 0),
              "awq_moe_m1_out_path: path must be 0 (auto), 1 (m16n8k16), 2 (m8n8k4) or 3 (the "
              "V100 design), got ",
              qpn_text::num(path));
  path &= kPathMask;
  const c10::cuda::CUDAGuard guard(out.device());
  const int device = out.get_device();
  const int cc_major = at::cuda::getDeviceProperties(device)->major;  // cached by torch
  TORCH_CHECK(cc_major >= 7, "awq_moe_m1_out: needs compute capability 7.0 or newer, device ",
              qpn_text::num(device), " has ", qpn_text::num(cc_major), ".x");
  // The V100 design (awq_moe_m1_sm70.cuh): the default below sm_90 where its grid fits, and
  // forced by path 3 on any GPU with mma.m8n8k4 (an error where its grid cannot be resident).
  const bool v100_design =
      path == kV100Design ||
      (path == kAuto && diag == 0 && cc_major < 9 && sm70_design_fits(device));
  TORCH_CHECK(!v100_design || path == kAuto || sm70_design_fits(device),
              "awq_moe_m1_out_path: the V100 design needs its ", qpn_text::num(qpn::kV100Ctas),
              " CTAs co-resident and cooperative launch; device ", qpn_text::num(device),
              " cannot");
  const bool use884 = path == kMma884 || (path == kAuto && cc_major < 8);
  TORCH_CHECK(v100_design || use884 || cc_major >= 8,
              "awq_moe_m1_out_path: the m16n8k16 path needs compute capability 8.0 or newer");

  qpn::MoeArgs args{};
  args.out = reinterpret_cast<__half*>(out.data_ptr());
  args.intermediate = reinterpret_cast<__half*>(intermediate.data_ptr());
  args.x = reinterpret_cast<const __half*>(x.data_ptr());
  args.w13 = reinterpret_cast<const unsigned*>(w13.data_ptr());
  args.s13 = s13.data_ptr();
  args.w2 = reinterpret_cast<const unsigned*>(w2.data_ptr());
  args.s2 = s2.data_ptr();
  args.ids = ids.data_ptr<int32_t>();
  args.weights = weights.data_ptr<float>();
  args.num_experts = static_cast<int>(w13.size(0));
  args.diag = ((diag & kDiagLaunchOnly) ? qpn::kDiagLaunchOnly : 0) |
              ((diag & kDiagNoPrefetch) ? qpn::kDiagNoW2Prefetch : 0);
  args.b_delay_ns = static_cast<int>(((diag & kDiagBDelayMask) >> kDiagBDelayShift) * 250);

  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device).stream();
  const bool meta3 = format == MetaFormat::kThreeByte;
  if (v100_design) {
    launch_sm70(args, meta3, stream);
    return;
  }
  if (meta3 && use884) launch<true, true>(args, stream, device, cc_major, diag);
  else if (meta3) launch<true, false>(args, stream, device, cc_major, diag);
  else if (use884) launch<false, true>(args, stream, device, cc_major, diag);
  else launch<false, false>(args, stream, device, cc_major, diag);
}

void awq_moe_m1_out_cuda(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                         const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                         const at::Tensor& s2, const at::Tensor& ids, const at::Tensor& weights) {
  awq_moe_m1_out_path_cuda(out, intermediate, x, w13, s13, w2, s2, ids, weights, kAuto);
}

#ifdef QPN_TRACE
// Tracing builds only: copy the last call's timeline stamps, SMs and cycle counts into out
// (int64, kTraceSlots x kTraceColumns = 272 x 33), then clear them, so that the slots the next
// traced call does not write read as zero.
void trace_read_cuda(at::Tensor& out) {
  TORCH_CHECK(out.is_cuda() && out.scalar_type() == at::kLong && out.is_contiguous() &&
                  out.numel() == qpn::kTraceSlots * qpn::kTraceColumns,
              "qpnserve_trace::read: out must be a contiguous CUDA int64 tensor of 8976 elements");
  const c10::cuda::CUDAGuard guard(out.device());
  C10_CUDA_CHECK(cudaMemcpyFromSymbolAsync(
      out.data_ptr(), qpn::g_trace, sizeof(qpn::g_trace), 0, cudaMemcpyDeviceToDevice,
      at::cuda::getCurrentCUDAStream(out.get_device()).stream()));
  void* stamps = nullptr;
  C10_CUDA_CHECK(cudaGetSymbolAddress(&stamps, qpn::g_trace));
  C10_CUDA_CHECK(cudaMemsetAsync(stamps, 0, sizeof(qpn::g_trace),
                                 at::cuda::getCurrentCUDAStream(out.get_device()).stream()));
}
#endif

}  // namespace
}  // namespace qpnserve

#ifdef QPN_TRACE
TORCH_LIBRARY(qpnserve_trace, m) { m.def("read(Tensor(a!) out) -> ()"); }
TORCH_LIBRARY_IMPL(qpnserve_trace, CUDA, m) { m.impl("read", &qpnserve::trace_read_cuda); }
#endif

TORCH_LIBRARY_IMPL(qpnserve, CUDA, m) {
  m.impl("awq_moe_m1_out", &qpnserve::awq_moe_m1_out_cuda);
  m.impl("awq_moe_m1_out_path", &qpnserve::awq_moe_m1_out_path_cuda);
}
