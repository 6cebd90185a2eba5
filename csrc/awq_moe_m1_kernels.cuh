// Kernels of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator.
// The per-warp arithmetic (decode, tensor-core steps) is in awq_moe_m1_math.cuh; the torch
// binding in awq_moe_m1_cuda.cu; the contract (bank layout, staged roundings) in
// docs/contract.md sections 3-4. Like the math header, this one needs nothing but cuda_fp16.h
// (NVRTC compiles it for the sm_70 CI gate).
//
// Three forms, no atomics, every reduction in a fixed order:
//
// Split form (sm_90 default, PATH_AUTO with PDL):
//   kernel A  grid (10 W13 column tiles, 10 routes), 16 warps: the unit (tile, route) streams
//             its W13 tile (32 columns = 16 values of h) and the 16 rows of W2 those values
//             multiply, all at once; SwiGLU; then that slice's FP32 share of y_route for all
//             2560 columns, to a module buffer (g_y_part).
//   kernel C  grid (80 output tiles): per (route, column) the 10 shares in tile order, y_route
//             rounded to FP16, the routes combined in router order.
// Two-kernel form (sm_70 and sm_80-89; the V100 route):
//   kernel A  grid (10 W13 column tiles, 10 routes), 8 or 16 warps: each warp streams kG groups
//             (32 k x 32 columns, 512 B of codes + metadata each) of one tile of one routed
//             expert, then prefetches its share of the route's W2 into L2; the warps' FP32
//             partials meet in shared memory in warp order; 16 threads apply SwiGLU and write
//             16 values of intermediate[route].
//   kernel B  grid (80 W2 column tiles), one warp per route: each warp loads its 5 groups of
//             W2 (independent of h) and, under PDL on sm_90, dequantizes them while it waits
//             for kernel A; then dots them with h, rounds y_route to FP16; 32 threads combine
//             the routes in router order.
// Fused single launch (sm_80+, the two-kernel units with per-route counters instead of the
// kernel boundary): tested but slower on the H200 (docs/performance.md section 4).

#pragma once

// Reading order: what the forms share, the two-kernel and fused forms, the split form.
#include "awq_moe_m1_common.cuh"
#include "awq_moe_m1_two_kernel.cuh"
#include "awq_moe_m1_split.cuh"
