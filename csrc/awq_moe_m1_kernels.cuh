// Kernels of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator.
// The per-warp arithmetic (decode, tensor-core steps) is in awq_moe_m1_math.cuh; the torch
// binding in awq_moe_m1_cuda.cu; the contract (bank layout, staged roundings) in
// docs/contract.md sections 3-4. Like the math header, this one needs nothing but cuda_fp16.h
// (NVRTC compiles it for the sm_70 CI gate).
//
// Two units per call, every reduction in a fixed order (no atomic operation touches a value):
//   unit A    (10 W13 column tiles x 10 routes): each warp streams its groups (32 k x 32
//             columns, 512 B of codes + metadata each) of one tile of one routed expert; the
//             warps' FP32 partials meet in shared memory in warp order; 16 threads apply SwiGLU
//             and write 16 values of intermediate[route].
//   unit B    one warp per route: each warp loads its groups of W2 (independent of h), then dots
//             them with h, rounds y_route to FP16; threads of the tile combine the routes in
//             router order.
// The sm_90 default (awq_moe_m1_two_kernel.cuh): both kernels are programmatic dependents and
// run together; kernel A (16 warps, m16n8k16) publishes h with the call's tag, kernel B (160
// tiles of 16 columns) dequantizes its W2 while kernel A streams W13 and polls h.
// The V100 design (awq_moe_m1_sm70.cuh, every GPU from sm_70 where its grid is co-resident):
// one cooperative launch of 80 CTAs (m8n8k4), each a unit A, a strip of W13 and a W2 tile, with a
// grid barrier between h and W2; the default below sm_90.

#pragma once

#include "awq_moe_m1_common.cuh"
#include "awq_moe_m1_two_kernel.cuh"
#include "awq_moe_m1_sm70.cuh"
