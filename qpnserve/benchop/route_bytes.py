"""Bytes the op must read per call, per metadata format (contract sections 2 and 3). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qpnserve.geometry import GROUP, HIDDEN, INTERMEDIATE, TOP_K, W13_N

MetaFormat = Literal["4byte", "3byte"]

# read_floor_m1's launch geometry (csrc/bench_floor.cu): threads per CTA and 16-byte vectors.
FLOOR_THREADS = 256
VEC_BYTES = 16
FLOOR_LOADS_PER_THREAD = (2, 4, 8, 16)


def meta_record_bytes(fmt: MetaFormat) -> int:
    """Bytes of one (group, column) metadata record: int32 (scale, bias) or uint8 x3."""
    if fmt == "4byte":
        return 4
    if fmt == "3byte":
        return 3
    raise ValueError(f"unknown metadata format {fmt!r}; use 4byte or 3byte")


@dataclass(frozen=True)
class RouteBytes:
    """Bytes of one routed expert, by tensor; every field is a multiple of 16."""

    w13_weight: int
    w13_meta: int
    w2_weight: int
    w2_meta: int

    @property
    def per_route(self) -> int:
        return self.w13_weight + self.w13_meta + self.w2_weight + self.w2_meta

    @property
    def per_call(self) -> int:
        """The ten routes' weights and metadata: what one call must stream from memory."""
        return TOP_K * self.per_route


def route_bytes(fmt: MetaFormat) -> RouteBytes:
    """4byte: 512,000 B of W13 + 256,000 B of W2 per route; 3byte: 486,400 + 243,200."""
    record = meta_record_bytes(fmt)
    return RouteBytes(
        w13_weight=HIDDEN * W13_N // 2,  # 4-bit codes
        w13_meta=(HIDDEN // GROUP) * W13_N * record,
        w2_weight=INTERMEDIATE * HIDDEN // 2,
        w2_meta=(INTERMEDIATE // GROUP) * HIDDEN * record,
    )


def floor_chunks_per_route(fmt: MetaFormat, loads_per_thread: int) -> int:
    """CTAs per route of read_floor_m1: each of the four segments in whole chunks."""
    if loads_per_thread not in FLOOR_LOADS_PER_THREAD:
        raise ValueError(f"loads_per_thread must be one of {FLOOR_LOADS_PER_THREAD}")
    per_block = loads_per_thread * FLOOR_THREADS * VEC_BYTES
    rb = route_bytes(fmt)
    segments = (rb.w13_weight, rb.w13_meta, rb.w2_weight, rb.w2_meta)
    return sum(-(-segment // per_block) for segment in segments)


def floor_sink_len(fmt: MetaFormat, loads_per_thread: int) -> int:
    """int32 partial sums read_floor_m1 writes: one per warp of its (chunks, 10) grid."""
    return floor_chunks_per_route(fmt, loads_per_thread) * TOP_K * (FLOOR_THREADS // 32)


def dense_fp16_bytes_per_call() -> int:
    """The dense baseline's already-dequantized FP16 W13 and W2 of ten experts."""
    return TOP_K * (HIDDEN * W13_N + INTERMEDIATE * HIDDEN) * 2
