"""The init contract, per MoE layer after the host's process_weights_after_loading: each
requirement broken in turn fails closed under flag 1 (layer and requirement named, reported)
and is left entirely to the host under flag 0."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG
from qpnserve.dispatch.wrap import MARKER
from qpnserve.errors import DispatchError
from qpnserve.plugin import register
from qpnserve.route_report import read_reports
from tests.dispatch.standin import FakeHost, SpyOperator, StandInLayer, prepared_banks

LAYER = "model.language_model.layers.7.mlp.experts"


def _bank(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


# case -> (what to change, the words the failure must contain)
BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "tp size 2": ({"moe_config": types.SimpleNamespace(tp_size=2, tp_rank=0)}, "tp_size == 4"),
    "256 experts": ({"sm70_num_experts": 256}, "sm70_num_experts == 512"),
    "hidden 4096": ({"sm70_hidden_logical_size": 4096}, "sm70_hidden_logical_size == 2560"),
    "w13 k 2048": ({"sm70_w13_k_dim": 2048}, "sm70_w13_k_dim == 2560"),
    "w13 n 384": ({"sm70_w13_n_dim": 384}, "sm70_w13_n_dim == 320"),
    "w2 k 192": ({"sm70_w2_k_dim": 192}, "sm70_w2_k_dim == 160"),
    "w2 n 2048": ({"sm70_w2_n_dim": 2048}, "sm70_w2_n_dim == 2560"),
    "per-expert dense": ({"sm70_awq_moe_batched_gemm": False}, "sm70_awq_moe_batched_gemm"),
    "w13 not interleaved": (
        {"sm70_awq_moe_w13_interleaved": False},
        "sm70_awq_moe_w13_interleaved",
    ),
    "no legacy compact": (
        {"sm70_awq_moe_legacy_single_token_compact": False},
        "sm70_awq_moe_legacy_single_token_compact",
    ),
    "checkpoint group 128": ({"sm70_awq_checkpoint_group_size": 128}, "checkpoint group size"),
    "w13 weight int64": (
        {"w13_tm_weight": _bank((512, 2560, 40), torch.int64)},
        "w13_tm_weight is (512, 2560, 40) int32",
    ),
    "w13 scales fp16": (
        {"w13_tm_scales": _bank((512, 80, 320), torch.float16)},
        "w13_tm_scales is",
    ),
    "w2 weight 256 experts": (
        {"w2_tm_weight": _bank((256, 160, 320), torch.int32)},
        "w2_tm_weight is (512, 160, 320) int32",
    ),
    "w2 scales group 64": ({"w2_tm_scales": _bank((512, 2, 2560), torch.int32)}, "w2_tm_scales is"),
    "mixed metadata formats": (
        {"w2_tm_scales": _bank((512, 5, 2560, 3), torch.uint8)},
        "one metadata format",
    ),
    "strided w2 bank": (
        {"w2_tm_weight": _bank((512, 320, 160), torch.int32).transpose(1, 2)},
        "w2_tm_weight is contiguous",
    ),
    "w2 bank missing": ({"w2_tm_weight": None}, "w2_tm_weight is a tensor"),
}


def _layer(overrides: dict[str, Any]) -> StandInLayer:
    overrides = dict(overrides)
    layer = StandInLayer(stand_in_prepared=prepared_banks(), layer_name=LAYER)
    if "moe_config" in overrides:
        layer.moe_config = overrides.pop("moe_config")
    layer.stand_in_overrides = overrides
    return layer


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_requirement_fails_closed_under_1(
    case: str, validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    cls = validated_fake.host_class()
    overrides, words = BROKEN[case]
    layer = _layer(overrides)
    with pytest.raises(DispatchError) as caught:
        cls(4, 32, True, layer).process_weights_after_loading(layer)
    assert LAYER in caught.value.message and words in caught.value.message
    (report,) = read_reports(report_dir)
    assert [d.layer for d in report.layers] == [LAYER]
    assert report.layers[0].admitted is False and words in report.layers[0].reason


def test_method_group_64_fails_closed_under_1(
    validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    layer = _layer({})
    with pytest.raises(DispatchError, match="method group_size == 32"):
        validated_fake.host_class()(4, 64, True, layer).process_weights_after_loading(layer)


def test_unloaded_operator_fails_closed(validated_fake: FakeHost, tmp_path: Path) -> None:
    from qpnserve.dispatch.recorder import RouteRecorder
    from qpnserve.dispatch.wrap import install_patched

    cls = validated_fake.host_class()
    recorder = RouteRecorder(
        route_flag="1",
        host_kind="patched",
        host_version="1.3.0",
        patch_id="awq_m1_dispatch",
        build_key=None,
        report_dir=tmp_path,
    )
    install_patched(cls, op=None, recorder=recorder, patch_id="awq_m1_dispatch")  # type: ignore[arg-type]
    layer = _layer({})
    with pytest.raises(DispatchError, match="qpnserve operator is loaded"):
        cls(4, 32, True, layer).process_weights_after_loading(layer)


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_requirement_is_untouched_under_0(
    case: str, validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "0")
    register()
    cls = validated_fake.host_class()
    assert MARKER not in cls.__dict__
    overrides, _ = BROKEN[case]
    layer = _layer(overrides)
    cls(4, 32, True, layer).process_weights_after_loading(layer)  # the host's own, no raise
    assert layer.host_init_calls == 1
    assert not hasattr(layer, "qpnserve_awq_m1_admitted")
    assert not report_dir.exists()


def test_valid_layer_is_admitted_and_reported(
    validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path, monkeypatch
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    register()
    cls = validated_fake.host_class()
    for metadata in ("int32", "uint8"):
        layer = StandInLayer(
            stand_in_prepared=prepared_banks(metadata=metadata),
            layer_name=f"model.language_model.layers.{metadata}.mlp.experts",
            moe_config=types.SimpleNamespace(tp_size=4, tp_rank=2),
        )
        cls(4, 32, True, layer).process_weights_after_loading(layer)
        assert layer.host_init_calls == 1
    (report,) = read_reports(report_dir)
    assert report.tp_rank == 2 and report.tp_size == 4
    assert report.host_kind == "patched" and report.host_version == "1.3.0"
    assert report.patch_id == "awq_m1_dispatch" and report.build_key == "test-build-key"
    assert report.route_flag == "1" and report.num_admitted == 2
    assert (report_dir / "route-rank2.json").is_file()


@pytest.mark.parametrize(
    ("archs", "capability", "ok"),
    [
        (("7.0",), (7, 0), True),
        (("7.0",), (7, 5), True),  # same major, newer minor runs an sm_70 cubin
        (("9.0",), (7, 0), False),  # an H200 build on a V100
        (("7.5",), (7, 0), False),
        ((), (7, 0), False),  # a CPU-only build on a GPU server
    ],
)
def test_extension_built_for_another_gpu_fails_the_contract(
    archs: tuple[str, ...], capability: tuple[int, int], ok: bool, monkeypatch
) -> None:
    from qpnserve.dispatch.contract import arch_failure

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    problem = arch_failure(torch.device("cuda", 0), archs)
    assert (problem is None) == ok
    if not ok:
        assert problem is not None and f"sm_{capability[0]}{capability[1]}" in problem


def test_arch_is_not_checked_for_cpu_banks_or_unknown_builds() -> None:
    from qpnserve.dispatch.contract import arch_failure

    assert arch_failure(torch.device("cpu"), ("9.0",)) is None
    assert arch_failure(torch.device("cuda", 0), None) is None
