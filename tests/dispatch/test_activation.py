"""register() with flag 1, end to end through the plugin: patched host, native host, a host
without the hook, drift, a missing build, and re-entrancy."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from qpnserve.config import ROUTE_FLAG, load_settings
from qpnserve.dispatch import runtime
from qpnserve.dispatch.wrap import HOOK, INIT, MARKER
from qpnserve.errors import BuildError, DispatchError
from qpnserve.plugin import register
from qpnserve.route_report import read_reports
from tests.dispatch.conftest import manifest_validating
from tests.dispatch.standin import (
    FakeHost,
    SpyOperator,
    StandInLayer,
    one_token_call,
    prepared_banks,
)


@pytest.fixture(autouse=True)
def _flag_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")


def _init_layer(cls: type, name: str, **layer_kwargs: object) -> StandInLayer:
    layer = StandInLayer(stand_in_prepared=prepared_banks(), layer_name=name, **layer_kwargs)  # type: ignore[arg-type]
    cls(4, 32, True, layer).process_weights_after_loading(layer)  # type: ignore[call-arg]
    return layer


def test_flag_1_on_validated_host_wraps_both_methods(
    validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path
) -> None:
    register()
    cls = validated_fake.host_class()
    marker = cls.__dict__[MARKER]
    assert marker["mode"] == "patched" and marker["patch_id"] == "awq_m1_dispatch"
    assert cls.__dict__[INIT] is not marker["originals"][INIT]
    assert cls.__dict__[HOOK] is not marker["originals"][HOOK]


def test_applying_twice_equals_applying_once(
    validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path
) -> None:
    register()
    cls = validated_fake.host_class()
    first = (cls.__dict__[INIT], cls.__dict__[HOOK], cls.__dict__[MARKER])
    register()
    assert (cls.__dict__[INIT], cls.__dict__[HOOK], cls.__dict__[MARKER]) == first
    layer = _init_layer(cls, "model.language_model.layers.0.mlp.experts")
    assert layer.host_init_calls == 1
    args = one_token_call(1)
    method = cls(4, 32, True, layer)
    method._apply_legacy_single_token_compact(
        layer,
        args["x"],
        args["topk_weights"],
        args["topk_ids_i32"],
        {"intermediate": args["intermediate"]},
        10,
        args["output"],
    )
    assert len(spy_op.calls) == 1
    (report,) = read_reports(report_dir)
    assert len(report.layers) == 1


def test_report_lists_every_layer_seen_so_far(
    validated_fake: FakeHost, spy_op: SpyOperator, report_dir: Path
) -> None:
    register()
    cls = validated_fake.host_class()
    config = types.SimpleNamespace(tp_size=4, tp_rank=3)
    names = [f"model.language_model.layers.{i}.mlp.experts" for i in range(3)]
    for name in names:
        _init_layer(cls, name, moe_config=config)
    (report,) = read_reports(report_dir)
    assert [d.layer for d in report.layers] == names
    assert all(d.admitted and d.reason == "" for d in report.layers)
    assert report.tp_rank == 3 and report.pid > 0


def test_drifted_host_refuses_before_import(
    fake_host: FakeHost, spy_op: SpyOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped manifest (real v1.3.0 fingerprints) against the stand-in: refuse, and the
    host module is never imported."""
    with pytest.raises(DispatchError, match=r"process_weights_after_loading.*1cat-vllm 1\.3\.0"):
        register()
    import sys

    assert "vllm.model_executor.layers.quantization.awq_sm70_moe" not in sys.modules
    assert spy_op.calls == []


def test_missing_prebuilt_extension_stops_with_build_hint(
    validated_fake: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(build_dir: Path) -> None:
        raise BuildError("no prebuilt qpnserve extension; run `qpnserve build`")

    monkeypatch.setattr(runtime, "load_operator", no_build)
    with pytest.raises(BuildError, match="qpnserve build"):
        register()
    assert MARKER not in validated_fake.host_class().__dict__


def test_signature_drift_refuses(fake_host: FakeHost, spy_op: SpyOperator, monkeypatch) -> None:
    fake_host.edit_source(
        "self, layer, x, topk_weights, topk_ids_i32, buffers, top_k, output\n",
        "self, layer, x, topk_weights, topk_ids, buffers, top_k, output\n",
    )
    manifest = manifest_validating(fake_host)  # fingerprints match the edited source
    monkeypatch.setattr(runtime, "load_manifest", lambda: manifest)
    with pytest.raises(DispatchError, match="the patch expects"):
        register()


def test_host_without_hook_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.dispatch.standin import forget_vllm_modules, write_fake_host

    forget_vllm_modules()
    host = write_fake_host(tmp_path / "site", with_hook=False)
    monkeypatch.syspath_prepend(str(host.site))
    try:
        with pytest.raises(DispatchError, match="neither the native AWQ M1 route nor"):
            register()
    finally:
        forget_vllm_modules()


def test_native_host_is_observed_not_patched(
    native_host: FakeHost, report_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_extension(build_dir: Path) -> None:
        raise AssertionError("a native host must not load qpnserve's extension")

    monkeypatch.setattr(runtime, "load_operator", no_extension)
    register()
    cls = native_host.host_class()
    assert cls.__dict__[MARKER]["mode"] == "observe"
    assert HOOK not in cls.__dict__[MARKER]["originals"]
    _init_layer(cls, "model.language_model.layers.0.mlp.experts")
    declined = StandInLayer(
        stand_in_prepared=prepared_banks(),
        layer_name="model.language_model.layers.1.mlp.experts",
        stand_in_overrides={"sm70_awq_qwen38_qpn_m1": False},
    )
    cls(4, 32, True, declined).process_weights_after_loading(declined)
    (report,) = read_reports(report_dir)
    assert report.host_kind == "native" and report.patch_id is None and report.build_key is None
    assert [d.admitted for d in report.layers] == [True, False]
    assert "sm70_awq_qwen38_qpn_m1 is False" in report.layers[1].reason


def test_native_host_whose_class_moved_is_left_alone(
    native_host: FakeHost, report_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_host.edit_source("class AWQSM70MoEMethod:", "class RenamedMethod:")
    activation = runtime.activate(load_settings())
    assert activation.mode == "none" and activation.host_kind == "native"
    assert not report_dir.exists()
