// Host side of the V100 design's launch, shared by the operator (awq_moe_m1_cuda.cu) and the
// bench extension's traced copy (bench_trace.cu), so both launch the kernel the same way: the
// co-residency check, the kernel arguments, one cooperative launch. nvcc only (it launches).

#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "awq_moe_m1_kernels.cuh"
#include "message_text.h"

namespace qpnserve {
namespace {

constexpr int kMaxDevices = 64;

// Whether all of the design's CTAs fit on `device` at once and the device can launch
// cooperatively (cached per device; neither query synchronises). A grid that cannot be
// co-resident would be refused by the driver with an error, never run.
inline bool v100_design_fits(int device) {
  static std::mutex mu;
  static std::array<int, kMaxDevices> cache{};  // 0 unknown, 1 no, 2 yes
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= kMaxDevices) return false;
  if (cache[device] == 0) {
    int cooperative = 0, sms = 0, per_sm_4 = 0, per_sm_3 = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm_4, qpn::v100_moe_kernel<false>, qpn::kV100Threads, 0));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm_3, qpn::v100_moe_kernel<true>, qpn::kV100Threads, 0));
    const int per_sm = per_sm_4 < per_sm_3 ? per_sm_4 : per_sm_3;
    cache[device] = cooperative != 0 && per_sm * sms >= qpn::kV100Ctas ? 2 : 1;
  }
  return cache[device] == 2;
}

// The kernel arguments of checked tensors (check_args ran), after the device checks.
inline qpn::MoeArgs v100_args(at::Tensor& out, at::Tensor& intermediate, const at::Tensor& x,
                              const at::Tensor& w13, const at::Tensor& s13, const at::Tensor& w2,
                              const at::Tensor& s2, const at::Tensor& ids,
                              const at::Tensor& weights, int device) {
  const int cc_major = at::cuda::getDeviceProperties(device)->major;  // cached by torch
  TORCH_CHECK(cc_major >= 7, "awq_moe_m1_out: needs compute capability 7.0 or newer, device ",
              qpn_text::num(device), " has ", qpn_text::num(cc_major), ".x");
  TORCH_CHECK(v100_design_fits(device), "awq_moe_m1_out: the V100 design needs its ",
              qpn_text::num(qpn::kV100Ctas),
              " CTAs co-resident and cooperative launch; device ", qpn_text::num(device),
              " cannot run it");
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
  return args;
}

// One cooperative launch on `stream` (capturable in a CUDA graph); its grid barrier lives in the
// workspace the driver gives each cooperative launch, so calls in flight share no state.
inline void launch_v100(const qpn::MoeArgs& args, bool meta3, cudaStream_t stream) {
  qpn::MoeArgs a = args;
  void* params[] = {&a};
  const void* kernel = meta3 ? reinterpret_cast<const void*>(qpn::v100_moe_kernel<true>)
                             : reinterpret_cast<const void*>(qpn::v100_moe_kernel<false>);
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(qpn::kV100Ctas),
                                             dim3(qpn::kV100Threads), params, 0, stream));
}

}  // namespace
}  // namespace qpnserve
