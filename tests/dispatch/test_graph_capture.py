"""Which captured graphs carry the route: the wrappers record, per layer and per captured batch
size, whether the route went into the graph; the report says so, and nothing when nothing was
captured. On CPU the capture probe is replaced (a CPU tensor is never captured); the real
capture of a CUDA graph is tests/dispatch/test_graph_capture_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.dispatch import graphs, recorder
from qpnserve.dispatch.recorder import RouteRecorder
from qpnserve.dispatch.wrap import MARKER, install_observer, install_patched, remove
from qpnserve.route_report import CapturedGraph, read_reports
from tests.dispatch.standin import (
    GROUPED_ROUTE_VALUE,
    HOST_ROUTE_VALUE,
    FakeHost,
    SpyOperator,
    StandInLayer,
    prepared_banks,
)


def _recorder(report_dir: Path, host_kind: str = "patched") -> RouteRecorder:
    return RouteRecorder(
        route_flag="1",
        host_kind=host_kind,  # type: ignore[arg-type]
        host_version="1.3.0",
        patch_id="awq_m1_dispatch",
        build_key="k",
        report_dir=report_dir,
    )


@pytest.fixture
def capturing(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """A switch standing in for torch.cuda.is_current_stream_capturing()."""
    state = {"on": False}
    monkeypatch.setattr(graphs, "is_capturing", lambda x: state["on"])
    return state


@pytest.fixture
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "CAPTURE_FLUSH_S", 0.0)  # every capture record written at once


def _inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.zeros(rows, 2560, dtype=torch.float16),
        torch.zeros(rows, 10, dtype=torch.float32),
        torch.zeros(rows, 10, dtype=torch.int64),
    )


def _patched(cls: type, report_dir: Path, names: list[str]) -> tuple[list[StandInLayer], Any]:
    spy = SpyOperator()
    install_patched(cls, op=spy, recorder=_recorder(report_dir), patch_id="awq_m1_dispatch")
    layers = []
    for name in names:
        layer = StandInLayer(stand_in_prepared=prepared_banks(), layer_name=name)
        cls(4, 32, True, layer).process_weights_after_loading(layer)
        layers.append(layer)
    return layers, spy


def test_capture_at_1_and_2_rows_records_the_route_only_in_the_1_token_graph(
    fake_host: FakeHost, tmp_path: Path, capturing: dict[str, bool], no_delay: None
) -> None:
    cls = fake_host.host_class()
    (layer,), spy = _patched(cls, tmp_path, ["model.language_model.layers.0.mlp.experts"])
    method = cls(4, 32, True, layer)
    capturing["on"] = True
    for rows in (2, 1):  # vLLM captures the largest size first
        method.apply(layer, *_inputs(rows), None, None)
    capturing["on"] = False
    method.apply(layer, *_inputs(1), None, None)  # an eager call after capture: not a graph
    (report,) = read_reports(tmp_path)
    assert report.graphs_watched is True
    assert report.planned_capture_sizes is None  # the stand-in vllm has no config to read
    assert report.layers[0].captured == [
        CapturedGraph(rows=1, route=True),
        CapturedGraph(rows=2, route=False),
    ]
    assert len(spy.calls) == 2  # the captured one-token call and the eager one
    remove(cls)


def test_without_capture_nothing_is_recorded_and_apply_is_passed_through(
    fake_host: FakeHost, tmp_path: Path, capturing: dict[str, bool], no_delay: None
) -> None:
    cls = fake_host.host_class()
    (layer,), spy = _patched(cls, tmp_path, ["L0"])
    x, w, ids = _inputs(2)
    out = cls(4, 32, True, layer).apply(
        layer=layer, x=x, topk_weights=w, topk_ids=ids, shared_experts=None,
        shared_experts_input=None,
    )  # fmt: skip
    assert torch.all(out == GROUPED_ROUTE_VALUE) and spy.calls == []  # the host's own route
    (report,) = read_reports(tmp_path)
    assert report.graphs_watched is True and report.layers[0].captured == []
    assert hasattr(cls.__dict__["apply"], "__wrapped__")
    remove(cls)
    assert not hasattr(cls.__dict__["apply"], "__wrapped__")  # the host's own apply is back


def test_a_one_token_capture_the_admission_refuses_records_no_route(
    fake_host: FakeHost, tmp_path: Path, capturing: dict[str, bool], no_delay: None
) -> None:
    cls = fake_host.host_class()
    (layer,), spy = _patched(cls, tmp_path, ["L0"])
    x, w, ids = _inputs(1)
    capturing["on"] = True
    out = cls(4, 32, True, layer).apply(layer, x.to(torch.bfloat16), w, ids, None, None)
    assert torch.all(out == HOST_ROUTE_VALUE) and spy.calls == []
    (report,) = read_reports(tmp_path)
    assert report.layers[0].captured == [CapturedGraph(rows=1, route=False)]
    remove(cls)


def test_the_hook_captured_without_apply_around_it_is_recorded_too(
    fake_host: FakeHost, tmp_path: Path, capturing: dict[str, bool], no_delay: None
) -> None:
    cls = fake_host.host_class()
    (layer,), _ = _patched(cls, tmp_path, ["L0"])
    x, w, ids = _inputs(1)
    out = torch.empty(1, 2560, dtype=torch.float16)
    inter = torch.empty(10, 160, dtype=torch.float16)
    capturing["on"] = True
    cls(4, 32, True, layer)._apply_legacy_single_token_compact(
        layer, x, w, ids.to(torch.int32), {"intermediate": inter}, 10, out
    )
    (report,) = read_reports(tmp_path)
    assert report.layers[0].captured == [CapturedGraph(rows=1, route=True)]
    remove(cls)


def test_one_capture_without_the_route_at_a_size_keeps_that_size_false(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    rec.capture_flush_s = 0.0
    layer = StandInLayer(stand_in_prepared={}, layer_name="L0")
    rec.record(layer, admitted=True)
    rec.record_capture(layer, 1, True)  # e.g. the FULL graph at one row
    rec.record_capture(layer, 1, False)  # and a PIECEWISE one without the route
    rec.record_capture(layer, 1, True)
    (report,) = read_reports(tmp_path)
    assert report.layers[0].captured == [CapturedGraph(rows=1, route=False)]


def test_capture_records_are_gathered_until_the_flush(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    rec.capture_flush_s = 3600.0  # the timer never fires within the test: only flush() writes
    layer = StandInLayer(stand_in_prepared={}, layer_name="L0")
    rec.record(layer, admitted=True)
    rec.watch_graphs([1, 2, 4])
    for rows in (4, 2, 1):
        rec.record_capture(layer, rows, rows == 1)
    (before,) = read_reports(tmp_path)
    assert before.layers[0].captured == [] and before.graphs_watched is False
    rec.flush()
    (after,) = read_reports(tmp_path)
    assert after.graphs_watched is True and after.planned_capture_sizes == [1, 2, 4]
    assert [(g.rows, g.route) for g in after.layers[0].captured] == [
        (1, True),
        (2, False),
        (4, False),
    ]
    assert rec._timer is None


def test_native_host_records_captured_rows_with_the_route_unknown(
    native_host: FakeHost, tmp_path: Path, capturing: dict[str, bool], no_delay: None
) -> None:
    cls = native_host.host_class()
    install_observer(cls, recorder=_recorder(tmp_path, "native"))
    layer = StandInLayer(stand_in_prepared=prepared_banks(), layer_name="L0")
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)
    capturing["on"] = True
    for rows in (4, 1):
        out = method.apply(layer, *_inputs(rows), None, None)
    assert torch.all(out == HOST_ROUTE_VALUE)  # the host's own one-token route, untouched
    (report,) = read_reports(tmp_path)
    assert report.host_kind == "native" and report.graphs_watched is True
    assert report.layers[0].captured == [
        CapturedGraph(rows=1, route=None),
        CapturedGraph(rows=4, route=None),
    ]
    assert cls.__dict__[MARKER]["mode"] == "observe"
    remove(cls)


def test_planned_sizes_follow_vllms_own_graph_decision() -> None:
    from types import SimpleNamespace as NS

    mode = NS(name="FULL_AND_PIECEWISE")
    config = NS(model_config=NS(enforce_eager=False), compilation_config=NS(cudagraph_mode=mode))
    config.compilation_config.cudagraph_capture_sizes = [4, 1, 2, 2]
    assert graphs.capture_sizes_of(config) == [1, 2, 4]
    config.model_config.enforce_eager = True
    assert graphs.capture_sizes_of(config) == []
    config.model_config.enforce_eager = False
    config.compilation_config.cudagraph_mode = NS(name="NONE")
    assert graphs.capture_sizes_of(config) == []
    older = NS(model_config=NS(enforce_eager=False), compilation_config=NS(use_cudagraph=False))
    older.compilation_config.cudagraph_capture_sizes = [1, 2]
    assert graphs.capture_sizes_of(older) == []
    assert graphs.capture_sizes_of(None) is None
    assert graphs.planned_capture_sizes() in (None, [])  # no vLLM config is current here


def test_the_flush_timer_writes_the_gathered_records(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    rec.capture_flush_s = 3600.0  # the timer is started, and run here by hand (no waiting)
    layer = StandInLayer(stand_in_prepared={}, layer_name="L0")
    rec.record(layer, admitted=True)
    rec.record_capture(layer, 1, True)
    timer = rec._timer
    assert timer is not None and timer.daemon and timer.is_alive()
    rec.record_capture(layer, 2, False)
    assert rec._timer is timer  # one pending write gathers every record until it runs
    timer.cancel()
    timer.function()  # what the timer runs when it fires
    (report,) = read_reports(tmp_path)
    assert [(g.rows, g.route) for g in report.layers[0].captured] == [(1, True), (2, False)]
    assert rec._timer is None


def test_native_host_apply_survives_a_failing_capture_record(
    native_host: FakeHost,
    tmp_path: Path,
    capturing: dict[str, bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cls = native_host.host_class()
    rec = _recorder(tmp_path, "native")
    install_observer(cls, recorder=rec)
    layer = StandInLayer(stand_in_prepared=prepared_banks(), layer_name="L0")
    method = cls(4, 32, True, layer)
    method.process_weights_after_loading(layer)

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(rec, "record_capture", broken)
    capturing["on"] = True
    out = method.apply(layer, *_inputs(1), None, None)
    assert torch.all(out == HOST_ROUTE_VALUE)  # the host's call went on, its result returned
    remove(cls)
