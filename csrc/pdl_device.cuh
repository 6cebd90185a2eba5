// Programmatic dependent launch in device code (sm_90+), shared by the operator's kernels and the
// read-floor benchmark's, so both are launched and synchronised the same way. No-ops on older
// targets, where the launchers never set the launch attribute either. No includes: NVRTC
// compiles it for sm_70 (the CI gate, scripts/sm70_projection.py).

#pragma once

namespace qpn_pdl {

// Let the next kernel on the stream be scheduled now; it waits for our completion itself.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Wait until the previous kernel on the stream has completed and its memory is visible.
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace qpn_pdl
