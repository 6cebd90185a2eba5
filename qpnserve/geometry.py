"""The operator's geometry: one TP4 rank of Qwen3.8 AWQ g32 (contract section 2). Pure.

The one Python statement of these numbers, used by the FP64 reference and the bank packer
(qpnserve.kernels.reference), the read floor's byte counts and ``bench op``
(qpnserve.benchop), the runtime contract (qpnserve.dispatch.contract) and the checkpoint
checks (qpnserve.preflight.layout). csrc/awq_moe_m1_geometry.h states the same for C++ (the
kernels, the CPU implementation and the floor kernel).
"""

from __future__ import annotations

TP_SIZE = 4
NUM_EXPERTS = 512  # experts per MoE layer (the op takes any E >= 1)
TOP_K = 10  # routes per token
HIDDEN = 2560  # W13 K and W2 N
MOE_INTERMEDIATE = 640  # the checkpoint's moe_intermediate_size
INTERMEDIATE = MOE_INTERMEDIATE // TP_SIZE  # 160: W2 K per rank
W13_N = 2 * INTERMEDIATE  # gate and up, interleaved
GROUP = 32  # AWQ group along K
BITS = 4
WORD_BITS = 32  # AWQ GEMM packing stores its codes in int32 words
PACK = WORD_BITS // BITS  # 4-bit codes per int32 word
NUM_MOE_LAYERS = 48  # Qwen3.8: every decoder layer is an MoE layer (contract section 1)
