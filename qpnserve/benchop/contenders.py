"""What the benchmark runs per layer: the op, the read floor, and the two baselines.

Every contender is a callable on one layer's `LayerState` that writes `state.out` (1, 2560)
fp16 (and, where it has one, `state.intermediate` (10, 160) fp16). The baselines are written in
plain PyTorch so they run anywhere and capture into a CUDA graph; they compute the same
function as the op and are checked against the same FP64 reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qpnserve.benchop.banks import LayerBanks, dequantize
from qpnserve.geometry import HIDDEN, INTERMEDIATE, TOP_K, W13_N


@dataclass
class LayerState:
    """One contender's per-layer buffers (kept per layer so every output can be checked).

    x (1, 2560) fp16, ids (1, 10) int32, weights (1, 10) fp32: written by the derive kernel;
    out (1, 2560) fp16; intermediate (10, 160) fp16; sink (n,) int32 for the floor only.
    """

    banks: LayerBanks
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    out: torch.Tensor
    intermediate: torch.Tensor
    sink: torch.Tensor | None = None
    dense_w13: torch.Tensor | None = None  # (10, 2560, 320) fp16, dense baseline only
    dense_w2: torch.Tensor | None = None  # (10, 160, 2560) fp16, dense baseline only


Contender = Callable[[LayerState], None]
# derive(x_next, ids_next, weights_next, out_prev, seed, ids_src, weights_src)
Derive = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
    ],
    None,
]


def derive_torch(
    x_next: torch.Tensor,
    ids_next: torch.Tensor,
    weights_next: torch.Tensor,
    out_prev: torch.Tensor,
    seed: torch.Tensor,
    ids_src: torch.Tensor,
    weights_src: torch.Tensor,
) -> None:
    """The derive kernel's arithmetic in PyTorch (CPU tests): same FP32 steps, same rounding."""
    prev = out_prev.to(torch.float32).clamp(-8.0, 8.0)
    x_next.copy_((seed.to(torch.float32) + 0.125 * prev).to(torch.float16))
    ids_next.copy_(ids_src)
    weights_next.copy_(weights_src)


def dequantize_fp16(words: torch.Tensor, meta: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """What a user would write: unpack nibbles, w = q * s + b in FP32, round to FP16.

    (E', K, N/8) int32 and metadata -> (E', K, N) fp16; exact (see banks.dequantize).
    """
    return dequantize(words, meta, k, n)


def _swiglu_combine(state: LayerState, gate_up: torch.Tensor, w2: torch.Tensor) -> None:
    """gate_up (10, 1, 320) fp16 -> intermediate, then W2 and the router-weighted sum."""
    gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
    h = F.silu(gate.to(torch.float32)).to(torch.float16) * up  # (10, 1, 160) fp16
    y = torch.bmm(h, w2)  # (10, 1, 2560) fp16
    combined = (state.weights.view(TOP_K, 1, 1) * y.to(torch.float32)).sum(dim=0)
    state.intermediate.copy_(h.view(TOP_K, INTERMEDIATE))
    state.out.copy_(combined.to(torch.float16))


def torch_route(state: LayerState) -> None:
    """Plain PyTorch over the prepared banks: gather, unpack, dequantize, matmul, SwiGLU,
    matmul, weighted sum. Many kernels and FP16 temporaries: the no-custom-kernel baseline."""
    b = state.banks
    idx = state.ids.view(-1).to(torch.int64)
    w13 = dequantize_fp16(b.w13.index_select(0, idx), b.s13.index_select(0, idx), HIDDEN, W13_N)
    w2 = dequantize_fp16(b.w2.index_select(0, idx), b.s2.index_select(0, idx), INTERMEDIATE, HIDDEN)
    gate_up = torch.bmm(state.x.expand(TOP_K, HIDDEN).unsqueeze(1), w13)  # (10, 1, 320)
    _swiglu_combine(state, gate_up, w2)


def prepare_dense(state: LayerState) -> None:
    """Dequantize the layer's ten routed experts once, outside the timed graph."""
    b = state.banks
    idx = b.route_ids.view(-1).to(torch.int64)
    state.dense_w13 = dequantize_fp16(b.w13[idx], b.s13[idx], HIDDEN, W13_N).contiguous()
    state.dense_w2 = dequantize_fp16(b.w2[idx], b.s2[idx], INTERMEDIATE, HIDDEN).contiguous()


def dense_fp16(state: LayerState) -> None:
    """cuBLAS batched matmuls over already-dequantized FP16 weights of the same ten experts
    (gathered before timing, so this reads 24.6 MB of FP16 and no metadata)."""
    assert state.dense_w13 is not None and state.dense_w2 is not None, "prepare_dense first"
    gate_up = torch.bmm(state.x.expand(TOP_K, HIDDEN).unsqueeze(1), state.dense_w13)
    _swiglu_combine(state, gate_up, state.dense_w2)


def op_contender(op: Callable[..., None]) -> Contender:
    """The operator: op(out, intermediate, x, w13, s13, w2, s2, ids, weights)."""

    def run(state: LayerState) -> None:
        b = state.banks
        op(
            state.out,
            state.intermediate,
            state.x,
            b.w13,
            b.s13,
            b.w2,
            b.s2,
            state.ids,
            state.weights,
        )

    return run


@dataclass(frozen=True)
class FloorConfig:
    """One launch variant of read_floor_m1 (csrc/bench_floor.cu), launched plainly like the op."""

    loads_per_thread: int  # 16-byte loads each thread issues before any use: 2, 4, 8, 16
    cache_hint: int = 0  # 0: ld.global.cs; 1: L1 no-allocate + 256 B L2 prefetch (sm_80+)

    @property
    def label(self) -> str:
        return f"L{self.loads_per_thread}{'+pf256' if self.cache_hint == 1 else ''}"

    @property
    def what(self) -> str:
        hint = ", L1 no-allocate + L2 256 B prefetch" if self.cache_hint == 1 else ""
        return f"{self.loads_per_thread} x 16 B loads per thread{hint}"


def floor_contender(floor: Callable[..., None], config: FloorConfig) -> Contender:
    """read_floor_m1(sink, w13, s13, w2, s2, ids, loads_per_thread, cache_hint)."""

    def run(state: LayerState) -> None:
        assert state.sink is not None
        b = state.banks
        floor(
            state.sink,
            b.w13,
            b.s13,
            b.w2,
            b.s2,
            state.ids,
            config.loads_per_thread,
            config.cache_hint,
        )

    return run
