"""Typed wrapper and fake (meta) registration of ``torch.ops.qpnserve.awq_moe_m1_out``.

The library itself is loaded by ``qpnserve.kernels.build.load`` (or ``build``), which calls
``register_fake_once`` here; the C++ schema also names this module (``set_python_module``) so
torch imports it when it needs the fake.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

OP_NAME = "qpnserve::awq_moe_m1_out"

_fake_lock = threading.Lock()
_fake_registered = False


def awq_moe_m1_out(
    out: torch.Tensor,
    intermediate: torch.Tensor,
    x: torch.Tensor,
    w13: torch.Tensor,
    s13: torch.Tensor,
    w2: torch.Tensor,
    s2: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
) -> None:
    """One token's routed-expert MoE layer (AWQ 4-bit, group 32), written into ``out``.

    Arguments (all on one device, contiguous; 16-byte aligned, ids/weights 4-byte aligned):
      out:          (1, 2560) fp16, written completely
      intermediate: (10, 160) fp16, written completely: h of each route (caller-owned scratch)
      x:            (1, 2560) fp16
      w13:          (E, 2560, 40) int32 code words, tiled (contract section 3); E >= 1
      s13:          (E, 80, 320) int32 (fp16 scale | fp16 bias << 16) or (E, 80, 320, 3) uint8
                    (scale lo, scale hi, zero point); the dtype picks the format
      w2:           (E, 160, 320) int32 code words, tiled
      s2:           (E, 5, 2560) int32 or (E, 5, 2560, 3) uint8, same format as s13
      ids:          (1, 10) int32 expert ids in router order; an id outside [0, E) is a route
                    that contributes exactly zero and zeroes its intermediate row
      weights:      (1, 10) fp32 router weights

    For each route r (e = ids[0, r]): w = fp16_fma(q, s, b); gate/up = fp16(FP32 dot(x, w));
    h = fp16(fp16(silu(gate)) * up) with silu in FP32; y_r = fp16(FP32 dot(h, w2)); then
    out = fp16(acc), acc = fma(weights[r], y_r, acc) in FP32 over r in router order.
    Duplicate ids are separate routes. Deterministic; no allocation, no host synchronisation,
    current stream: capturable in a CUDA graph. On CUDA it is the V100 design on every GPU
    (compute capability 7.0 or newer; on a newer GPU correct, but not timed as a V100).
    Caller errors raise RuntimeError naming the argument.
    """
    import torch

    torch.ops.qpnserve.awq_moe_m1_out(out, intermediate, x, w13, s13, w2, s2, ids, weights)


def _check_fake_args(out: torch.Tensor, intermediate: torch.Tensor) -> None:
    import torch

    from qpnserve.geometry import HIDDEN, INTERMEDIATE, TOP_K

    if tuple(out.shape) != (1, HIDDEN) or out.dtype != torch.float16:
        raise RuntimeError(f"awq_moe_m1_out: out must be (1, {HIDDEN}) float16")
    if tuple(intermediate.shape) != (TOP_K, INTERMEDIATE) or intermediate.dtype != torch.float16:
        raise RuntimeError(
            f"awq_moe_m1_out: intermediate must be ({TOP_K}, {INTERMEDIATE}) float16"
        )


def register_fake_once() -> None:
    """Register the fake kernels (mutating ops with no outputs: shape checks only)."""
    global _fake_registered
    with _fake_lock:
        if _fake_registered:
            return
        import torch

        def fake(out, intermediate, x, w13, s13, w2, s2, ids, weights):
            _check_fake_args(out, intermediate)

        torch.library.register_fake(OP_NAME)(fake)
        _fake_registered = True


def _register_if_loaded() -> None:
    # torch imports this module (set_python_module) once the library is loaded; never import
    # torch just for this.
    if "torch" not in sys.modules:
        return
    try:
        import torch

        torch._C._dispatch_find_schema_or_throw(OP_NAME, "")
    except (ImportError, RuntimeError):
        return
    register_fake_once()


_register_if_loaded()
