// Programmatic dependent launch in device code (sm_90+), used by the bench extension's read-floor
// kernel (the operator, one cooperative launch since #31, has no PDL; `bench op` times the floor
// without it too). No-ops on older targets, where the launchers never set the launch attribute
// either. No includes: NVRTC compiles it for sm_70 (the V100 model, tools/sm70proj).

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
