from __future__ import annotations

import pytest

from qpnserve.benchop.route_bytes import (
    dense_fp16_bytes_per_call,
    floor_chunks_per_route,
    floor_sink_len,
    route_bytes,
)


def test_route_bytes_4byte_matches_issue_figures() -> None:
    rb = route_bytes("4byte")
    assert rb.w13_weight + rb.w13_meta == 512_000
    assert rb.w2_weight + rb.w2_meta == 256_000
    assert rb.per_call == 7_680_000


def test_route_bytes_3byte_metadata_is_three_quarters() -> None:
    rb = route_bytes("3byte")
    assert (rb.w13_meta, rb.w2_meta) == (76_800, 38_400)
    assert rb.w13_weight + rb.w13_meta == 486_400
    assert rb.w2_weight + rb.w2_meta == 243_200
    assert rb.per_call == 7_296_000


def test_every_route_segment_is_whole_16_byte_vectors() -> None:
    for fmt in ("4byte", "3byte"):
        rb = route_bytes(fmt)
        for size in (rb.w13_weight, rb.w13_meta, rb.w2_weight, rb.w2_meta):
            assert size % 16 == 0


def test_floor_grid_counts_each_segment_in_whole_chunks() -> None:
    # 4byte at 8 loads x 256 threads x 16 B = 32 KiB chunks: 13 + 4 + 7 + 2.
    assert floor_chunks_per_route("4byte", 8) == 26
    assert floor_sink_len("4byte", 8) == 26 * 10 * 8
    # 3byte metadata: 76,800 B -> 3 chunks, 38,400 B -> 2 chunks.
    assert floor_chunks_per_route("3byte", 8) == 13 + 3 + 7 + 2


def test_floor_rejects_unsupported_loads_per_thread() -> None:
    with pytest.raises(ValueError):
        floor_chunks_per_route("4byte", 3)


def test_dense_baseline_reads_fp16_weights_of_ten_experts() -> None:
    assert dense_fp16_bytes_per_call() == 10 * (2560 * 320 + 160 * 2560) * 2
