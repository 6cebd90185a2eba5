"""The read-floor and derive kernels of the bench extension on a GPU (run with -m gpu)."""

from __future__ import annotations

import pytest
import torch

from qpnserve.benchop.banks import floor_expected_sum, make_layer
from qpnserve.benchop.contenders import derive_torch
from qpnserve.benchop.route_bytes import FLOOR_LOADS_PER_THREAD, floor_sink_len
from qpnserve.config import load_settings

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from qpnserve.kernels.build import build

    build(
        target="bench", build_dir=load_settings().build_dir
    )  # the bench extension: the server's library has no floor
    return torch.ops.qpnserve_bench


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
@pytest.mark.parametrize("loads", FLOOR_LOADS_PER_THREAD)
@pytest.mark.parametrize("cache_hint", [0, 1])
def test_floor_reads_every_routed_word_once(ops, fmt: str, loads: int, cache_hint: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(loads)
    layer = make_layer(fmt, gen, torch.device("cuda"))
    ids = layer.route_ids.clone()
    ids[0, 3] = -1  # an invalid route reads nothing, as in the op
    sink = torch.full((floor_sink_len(fmt, loads),), 7, dtype=torch.int32, device="cuda")
    ops.read_floor_m1(sink, layer.w13, layer.s13, layer.w2, layer.s2, ids, loads, cache_hint)
    assert int(sink.to(torch.int64).sum()) & 0xFFFFFFFF == floor_expected_sum(
        layer, layer.route_ids[:, [0, 1, 2, 4, 5, 6, 7, 8, 9]]
    )


@pytest.mark.parametrize("fmt", ["4byte", "3byte"])
def test_floor_w13_mode_reads_every_routed_w13_word_once(ops, fmt: str) -> None:
    # cache_hint 2 (a tuning mode): the grid covers the W13 weights and metadata only.
    gen = torch.Generator(device="cuda").manual_seed(5)
    layer = make_layer(fmt, gen, torch.device("cuda"))
    ids = layer.route_ids.clone()
    ids[0, 7] = 512  # an invalid route reads nothing
    sink = torch.zeros((floor_sink_len(fmt, 4),), dtype=torch.int32, device="cuda")
    ops.read_floor_m1(sink, layer.w13, layer.s13, layer.w2, layer.s2, ids, 4, 2)
    assert int(sink.to(torch.int64).sum()) & 0xFFFFFFFF == floor_expected_sum(
        layer, layer.route_ids[:, [0, 1, 2, 3, 4, 5, 6, 8, 9]], w13_only=True
    )


def test_derive_kernel_matches_torch(ops) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    prev = (torch.randn(1, 2560, generator=gen, device="cuda") * 20).half()
    seed = torch.randn(1, 2560, generator=gen, device="cuda").half()
    ids = torch.randint(0, 512, (1, 10), generator=gen, device="cuda", dtype=torch.int32)
    w = torch.rand(1, 10, generator=gen, device="cuda")
    got = (torch.empty_like(seed), torch.empty_like(ids), torch.empty_like(w))
    want = (torch.empty_like(seed), torch.empty_like(ids), torch.empty_like(w))
    ops.derive_input_m1(*got, prev, seed, ids, w)
    derive_torch(*want, prev, seed, ids, w)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# Last: an argument error raised from the extension (kept last so the others report first).
def test_floor_rejects_bad_loads_per_thread(ops) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = make_layer("4byte", gen, torch.device("cuda"))
    sink = torch.zeros(8192, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="loads_per_thread"):
        ops.read_floor_m1(sink, layer.w13, layer.s13, layer.w2, layer.s2, layer.route_ids, 3)
