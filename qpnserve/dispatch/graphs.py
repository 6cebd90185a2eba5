"""Which CUDA graphs carry the route: the two facts the wrappers read from the running process.

vLLM runs a MoE layer's Python (the host method's apply() and the hook under it) only in eager
calls and while it captures a CUDA graph; every replay runs the kernels captured then. So the
route fires on a single-token decode step exactly when vLLM replays a graph captured at one row
with the route in it (or runs that step eagerly). The wrappers record, per layer, the rows
seen while the current stream was capturing and whether the route was admitted; this module
says whether a call is being captured and which sizes vLLM planned to capture.
"""

from __future__ import annotations

from typing import Any


def is_capturing(x: Any) -> bool:
    """True while the current CUDA stream captures a graph (the call's x is on that device).

    A CPU tensor is never captured; checking it first keeps torch.cuda out of CPU-only runs.
    """
    if not getattr(x, "is_cuda", False):
        return False
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def planned_capture_sizes() -> list[int] | None:
    """vLLM's own CUDA-graph capture sizes in this process: [] when it captures none (eager
    mode, or graphs off), None when its configuration cannot be read here.

    Read during model load, where vLLM has set its current config. Only the ``_or_none``
    accessor is used: the plain one returns a default config outside that context, whose sizes
    would describe no real server.
    """
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
    except Exception:  # an older or a stand-in vllm: nothing to read, nothing to claim
        return None
    return capture_sizes_of(config)


def capture_sizes_of(config: Any) -> list[int] | None:
    """The decision of planned_capture_sizes() over a VllmConfig-like object (pure)."""
    if config is None:
        return None
    model = getattr(config, "model_config", None)
    compilation = getattr(config, "compilation_config", None)
    if getattr(model, "enforce_eager", False) is True:
        return []
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is not None and getattr(mode, "name", None) == "NONE":
        return []
    if getattr(compilation, "use_cudagraph", None) is False:  # vLLM before cudagraph_mode
        return []
    sizes = getattr(compilation, "cudagraph_capture_sizes", None)
    if isinstance(sizes, list | tuple) and all(isinstance(n, int) for n in sizes):
        return sorted(set(sizes))
    return None
