"""Run-time admission: only the one physical token reaches the operator, with the host's own
tensors; everything else takes the host's original route, untouched."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.dispatch.contract import admission_failure
from qpnserve.dispatch.recorder import RouteRecorder
from qpnserve.dispatch.wrap import install_patched, remove
from tests.dispatch.standin import (
    HOST_ROUTE_VALUE,
    FakeHost,
    SpyOperator,
    StandInLayer,
    one_token_call,
    prepared_banks,
)


def _recorder(report_dir: Path) -> RouteRecorder:
    return RouteRecorder(
        route_flag="1",
        host_kind="patched",
        host_version="1.3.0",
        patch_id="awq_m1_dispatch",
        build_key="k",
        report_dir=report_dir,
    )


@pytest.fixture
def patched(fake_host: FakeHost, tmp_path: Path) -> Any:
    """(method instance, prepared layer, spy) with the stand-in class patched."""
    cls = fake_host.host_class()
    spy = SpyOperator()
    install_patched(cls, op=spy, recorder=_recorder(tmp_path / "r"), patch_id="awq_m1_dispatch")
    layer = StandInLayer(stand_in_prepared=prepared_banks())
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)
    yield method, layer, spy
    remove(cls)


def _call(method: Any, layer: StandInLayer, args: dict[str, torch.Tensor]) -> torch.Tensor:
    buffers = {"intermediate": args["intermediate"], "output": args["output"]}
    return method._apply_legacy_single_token_compact(
        layer,
        args["x"],
        args["topk_weights"],
        args["topk_ids_i32"],
        buffers,
        10,
        args["output"],
    )


@pytest.mark.parametrize("num_tokens", [0, 1, 2, 4, 5, 8, 128, 8192])
def test_only_one_token_is_admitted(patched: Any, num_tokens: int) -> None:
    method, layer, spy = patched
    args = one_token_call(num_tokens)
    result = _call(method, layer, args)
    assert result is args["output"]
    if num_tokens == 1:
        assert len(spy.calls) == 1 and layer.host_route_calls == []
        assert torch.all(result == SpyOperator.VALUE)
    else:
        assert spy.calls == [] and layer.host_route_calls == [(num_tokens, 2560)]
        assert num_tokens == 0 or torch.all(result == HOST_ROUTE_VALUE)


def _strided_x() -> torch.Tensor:
    return torch.zeros(1, 5120, dtype=torch.float16)[:, ::2]


REJECTED: dict[str, tuple[str, Any]] = {
    "bf16 x": ("x", lambda: torch.zeros(1, 2560, dtype=torch.bfloat16)),
    "fp32 x": ("x", lambda: torch.zeros(1, 2560, dtype=torch.float32)),
    "fp16 router weights": ("topk_weights", lambda: torch.zeros(1, 10, dtype=torch.float16)),
    "int64 ids": ("topk_ids_i32", lambda: torch.zeros(1, 10, dtype=torch.int64)),
    "strided x": ("x", _strided_x),
    "strided ids": ("topk_ids_i32", lambda: torch.zeros(1, 20, dtype=torch.int32)[:, ::2]),
    "strided weights": ("topk_weights", lambda: torch.zeros(1, 20, dtype=torch.float32)[:, ::2]),
    "x hidden 2048": ("x", lambda: torch.zeros(1, 2048, dtype=torch.float16)),
    "x 1-D": ("x", lambda: torch.zeros(2560, dtype=torch.float16)),
    "x 3-D": ("x", lambda: torch.zeros(1, 1, 2560, dtype=torch.float16)),
    "top-8 ids": ("topk_ids_i32", lambda: torch.zeros(1, 8, dtype=torch.int32)),
    "top-8 weights": ("topk_weights", lambda: torch.zeros(1, 8, dtype=torch.float32)),
    "ids for 2 tokens": ("topk_ids_i32", lambda: torch.zeros(2, 10, dtype=torch.int32)),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_wrong_dtype_layout_or_shape_keeps_host_route(patched: Any, case: str) -> None:
    method, layer, spy = patched
    name, make = REJECTED[case]
    args = one_token_call(1)
    args[name] = make()
    assert admission_failure(args["x"], args["topk_weights"], args["topk_ids_i32"]) is not None
    result = _call(method, layer, args)
    assert spy.calls == []
    assert layer.host_route_calls == [tuple(args["x"].shape)]
    assert result is args["output"] and torch.all(result == HOST_ROUTE_VALUE)


def test_admitted_call_passes_host_banks_and_buffers_by_identity(patched: Any) -> None:
    method, layer, spy = patched
    args = one_token_call(1)
    buffers = {"intermediate": args["intermediate"], "output": args["output"]}
    result = method._apply_legacy_single_token_compact(
        layer, args["x"], args["topk_weights"], args["topk_ids_i32"], buffers, 10, args["output"]
    )
    (call,) = spy.calls
    expected = (
        args["output"],
        buffers["intermediate"],
        args["x"],
        layer.w13_tm_weight,
        layer.w13_tm_scales,
        layer.w2_tm_weight,
        layer.w2_tm_scales,
        args["topk_ids_i32"],
        args["topk_weights"],
    )
    assert len(call) == len(expected)
    assert all(got is want for got, want in zip(call, expected, strict=True))
    assert result is args["output"]


def test_longer_persistent_scratch_is_sliced_without_copy(patched: Any) -> None:
    """A (320, 160) persistent buffer: the operator gets its first 10 rows, same storage."""
    method, layer, spy = patched
    args = one_token_call(1)
    args["intermediate"] = torch.empty(320, 160, dtype=torch.float16)
    _call(method, layer, args)
    (call,) = spy.calls
    assert tuple(call[1].shape) == (10, 160)
    assert call[1].data_ptr() == args["intermediate"].data_ptr()
    assert call[1].untyped_storage().data_ptr() == args["intermediate"].untyped_storage().data_ptr()


def test_host_apply_routes_one_token_through_the_operator(patched: Any) -> None:
    """Through the stand-in's apply(): 1 token reaches the operator, 2 tokens never do."""
    method, layer, spy = patched
    x1 = torch.zeros(1, 2560, dtype=torch.float16)
    out1 = method.apply(
        layer, x1, torch.zeros(1, 10), torch.zeros(1, 10, dtype=torch.int64), None, None
    )
    assert len(spy.calls) == 1 and torch.all(out1 == SpyOperator.VALUE)
    x2 = torch.zeros(2, 2560, dtype=torch.float16)
    method.apply(layer, x2, torch.zeros(2, 10), torch.zeros(2, 10, dtype=torch.int64), None, None)
    assert len(spy.calls) == 1


def test_one_token_kept_on_host_route_is_logged_once(patched: Any, caplog) -> None:
    method, layer, _ = patched
    caplog.set_level(logging.WARNING, logger="vllm.qpnserve_awq_m1")
    for _ in range(3):
        args = one_token_call(1)
        args["x"] = torch.zeros(1, 2560, dtype=torch.bfloat16)
        _call(method, layer, args)
    messages = [r.getMessage() for r in caplog.records]
    warnings = [m for m in messages if "stays on the host route" in m]
    assert len(warnings) == 1
    assert "x dtype torch.bfloat16" in warnings[0] and layer.layer_name in warnings[0]


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("intermediate", lambda: torch.empty(10, 128, dtype=torch.float16)),
        ("intermediate", lambda: torch.empty(10, 160, dtype=torch.float32)),
        ("intermediate", lambda: torch.empty(5, 160, dtype=torch.float16)),
        ("output", lambda: torch.zeros(1, 2560, dtype=torch.float32)),
    ],
)
def test_host_buffers_the_operator_cannot_take_keep_host_route(
    patched: Any, name: str, make: Any
) -> None:
    method, layer, spy = patched
    args = one_token_call(1)
    args[name] = make()
    _call(method, layer, args)
    assert spy.calls == [] and layer.host_route_calls == [(1, 2560)]


# The physical-M=1 rule, one tensor at a time: a second row in any one of them (the others
# keeping one) must keep the host's route, so no check can lean on another tensor's shape.
TWO_ROWS: dict[str, Any] = {
    "x": lambda: torch.zeros(2, 2560, dtype=torch.float16),
    "topk_ids_i32": lambda: torch.zeros(2, 10, dtype=torch.int32),
    "topk_weights": lambda: torch.zeros(2, 10, dtype=torch.float32),
    "output": lambda: torch.zeros(2, 2560, dtype=torch.float16),
}


@pytest.mark.parametrize("name", list(TWO_ROWS))
def test_two_rows_in_any_single_tensor_keep_host_route(patched: Any, name: str) -> None:
    method, layer, spy = patched
    args = one_token_call(1)
    args[name] = TWO_ROWS[name]()
    result = _call(method, layer, args)
    assert spy.calls == []
    assert layer.host_route_calls == [tuple(args["x"].shape)]
    assert result is args["output"]
