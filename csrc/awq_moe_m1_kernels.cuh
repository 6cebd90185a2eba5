// Kernels of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator.
// The per-warp arithmetic (decode, tensor-core steps) is in awq_moe_m1_math.cuh; the torch
// binding in awq_moe_m1_cuda.cu; the contract (bank layout, staged roundings) in
// docs/contract.md sections 3-4. Like the math header, this one needs nothing but cuda_fp16.h
// (NVRTC compiles it for the sm_70 CI gate).
//
// Three forms, every reduction in a fixed order (no atomic operation touches a value):
//
// Two-kernel form (every GPU; PATH_AUTO):
//   kernel A  grid (10 W13 column tiles, 10 routes), 8 or 16 warps: each warp streams kG groups
//             (32 k x 32 columns, 512 B of codes + metadata each) of one tile of one routed
//             expert; the warps' FP32 partials meet in shared memory in warp order; 16 threads
//             apply SwiGLU and write 16 values of intermediate[route]. Except in the polled
//             form it also prefetches its share of the route's W2 into L2.
//   kernel B  grid (80 W2 column tiles), one warp per route: each warp loads its 5 groups of
//             W2 (independent of h), then dots them with h, rounds y_route to FP16; 32 threads
//             combine the routes in router order.
//   On sm_90 with PDL (the default there) both kernels run together: kernel B dequantizes W2
//   while kernel A streams W13, and gets h by polling what kernel A publishes with the call's
//   tag (PolledH, the polled hand-off) instead of waiting for kernel A's completion; its grid
//   there is 160 tiles of 16 columns (w2_combine16_kernel). Below sm_90 kernel B starts after
//   kernel A.
// Split form (PATH_SPLIT; the sm_90 default until the polled hand-off, slower than it):
//   kernel A  grid (10 W13 column tiles, 10 routes), 16 warps: the unit (tile, route) streams
//             its W13 tile (32 columns = 16 values of h) and the 16 rows of W2 those values
//             multiply, all at once; SwiGLU; then that slice's FP32 share of y_route for all
//             2560 columns, to a module buffer (g_y_part).
//   kernel C  grid (80 output tiles): per (route, column) the 10 shares in tile order, y_route
//             rounded to FP16, the routes combined in router order.
// Fused single launch (PATH_FUSED, sm_80+, the two-kernel units with per-route counters instead
// of the kernel boundary): tested but slower on the H200 (docs/performance.md section 4).

#pragma once

// Reading order: what the forms share, the two-kernel and fused forms, the split form.
#include "awq_moe_m1_common.cuh"
#include "awq_moe_m1_two_kernel.cuh"
#include "awq_moe_m1_split.cuh"
