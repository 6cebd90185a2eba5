"""qpnserve: the AWQ M=1 MoE decode route for 1Cat-vLLM on 4x Tesla V100.

Importing this package is instant: no torch, no vllm, no CUDA. Heavy imports live inside the
functions that need them.
"""

__version__ = "0.1.0"
