// One way to launch the bench extension's kernels (the read floor, the derive kernel), plainly or
// as a programmatic dependent. The operator, one cooperative launch since #31, is launched by its
// own binding; `bench op` times the floor without PDL, as the operator runs.
//
// pdl: launch as a programmatic dependent (sm_90+): the kernel may start while its predecessor
// on the stream still runs, and must call griddepcontrol.wait before reading what that
// predecessor writes. Host code only.

#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <utility>

namespace qpn_launch {

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, bool pdl, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl ? attrs : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qpn_launch
