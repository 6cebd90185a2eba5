// Host side of the V100 design (awq_moe_m1_sm70.cuh): whether its grid can be co-resident on a
// device, and its cooperative launch. Included once, by the launcher (awq_moe_m1_cuda.cu).

#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "awq_moe_m1_sm70.cuh"

namespace qpnserve {

// Whether all kV100Ctas CTAs of the V100 design fit on `device` at once, and the device can
// launch cooperatively; cached per device (0 unknown, 1 no, 2 yes). Neither query synchronises.
inline bool sm70_design_fits(int device) {
  static std::mutex mu;
  static std::array<int, 64> cache{};
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= static_cast<int>(cache.size())) return false;
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

// One cooperative launch on `stream` (capturable in a CUDA graph). A grid that cannot be
// co-resident is refused by the driver with an error (raised here), never run.
inline void launch_sm70(const qpn::MoeArgs& args, bool meta3, cudaStream_t stream) {
  qpn::MoeArgs a = args;
  a.diag |= qpn::kDiagNoW2Prefetch;  // unit A's W2 prefetch is the two-kernel form's, not ours
  void* params[] = {&a};
  const void* kernel = meta3 ? reinterpret_cast<const void*>(qpn::v100_moe_kernel<true>)
                             : reinterpret_cast<const void*>(qpn::v100_moe_kernel<false>);
  C10_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(qpn::kV100Ctas),
                                             dim3(qpn::kV100Threads), params, 0, stream));
}

}  // namespace qpnserve
