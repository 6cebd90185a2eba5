// Kernels of qpnserve::awq_moe_m1_out: the AWQ (4-bit, group 32) M=1 MoE decode operator, in
// its one CUDA form, the V100 design (awq_moe_m1_v100.cuh): one cooperative launch of 80 CTAs
// (m8n8k4), each a unit A (awq_moe_m1_common.cuh), a strip of W13 and a W2 output tile, with a
// grid barrier between h and W2. The per-warp arithmetic (decode, tensor-core steps) is in
// awq_moe_m1_math.cuh; the torch binding in awq_moe_m1_cuda.cu; the contract (bank layout,
// staged roundings) in docs/contract.md sections 3-4. Needs nothing but cuda_fp16.h (NVRTC
// compiles it for the sm_70 CI gate).
//
// Every reduction in a fixed order (no atomic operation touches a value).

#pragma once

#include "awq_moe_m1_v100.cuh"
