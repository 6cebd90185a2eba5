"""Live verify on a native host, in process: the real plugin on the native stand-in host class
(tests/dispatch/standin.py, NATIVE = True) whose hook calls ``_C::awq_moe_qpn_m1_sm70_out``, the
stand-in of the host's op (tests/support/host_ops.py: the real one is sm_70 SASS only).

While verify arms a prompt, the observer runs the host's op once more on each call the host
served and saves it as the route arm; the comparison with the reference decoded from the export
then catches the host's own preparation when it is wrong. Without verify's capture directory
the observer leaves the host's hook alone (observe only)."""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG, VERIFY_CAPTURE_DIR
from qpnserve.dispatch.capture import ARMED_FILE
from qpnserve.dispatch.wrap import HOOK, MARKER
from qpnserve.plugin import register
from qpnserve.verify.export import Checkpoint
from qpnserve.verify.live import compare_captures
from qpnserve.verify.report import VerifyReport, render_table
from qpnserve.verify.samples import sample
from tests.dispatch.conftest import _flag_unset, native_host, report_dir  # noqa: F401
from tests.dispatch.standin import HOST_ROUTE_VALUE, FakeHost, StandInLayer
from tests.support import host_ops
from tests.verify.layers import layer_from_export

RANK = 1


@pytest.fixture
def host_op(cpu_extension: Any) -> Any:
    """The stand-in of the host's op, computing with qpnserve's CPU operator."""
    host_ops.define()
    host_ops.reset()
    yield host_ops
    host_ops.reset()


@pytest.fixture
def serve_native(
    seeded_checkpoint: Path,
    host_op: Any,
    native_host: FakeHost,  # noqa: F811
    report_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Any:
    capture_dir = tmp_path / "capture"
    capture_dir.mkdir()
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.setenv(VERIFY_CAPTURE_DIR.name, str(capture_dir))
    register()
    cls = native_host.host_class()
    ck = Checkpoint(seeded_checkpoint)

    def serve(fault: str | None = None, **overrides: Any) -> tuple[Path, list[StandInLayer]]:
        served = []
        for layer in (0, 1):
            host_layer = layer_from_export(
                ck, layer, RANK, fmt="3byte", fault=fault if layer == 1 else None,
                prefixes=[0], **overrides,
            )  # fmt: skip
            method = cls(4, 32, True, host_layer)
            method.process_weights_after_loading(host_layer)
            (capture_dir / ARMED_FILE).write_text("0")
            s = sample(layer, 0)
            method.apply(
                host_layer,
                torch.from_numpy(s.x).view(1, 2560),
                torch.from_numpy(s.weights).view(1, 10),
                torch.from_numpy(s.ids).view(1, 10),
                None,
                None,
            )
            (capture_dir / ARMED_FILE).unlink()
            served.append(host_layer)
        return capture_dir, served

    return serve


def _report(model: Path) -> VerifyReport:
    return VerifyReport(
        mode="live", model=str(model), operator="test", banks="test", cost="test",
        layers=[0, 1], prefixes=[0], ranks=[RANK], meta_formats=["3byte"],
    )  # fmt: skip


def test_native_live_capture_through_the_host_op_passes(
    serve_native: Any, seeded_checkpoint: Path
) -> None:
    capture_dir, layers = serve_native()
    assert [layer.native_route_calls for layer in layers] == [1, 1]  # the host's route served
    report = compare_captures(capture_dir, _report(seeded_checkpoint), arms=["route"])
    assert report.verdict == "pass", report.summary()
    assert len(report.examined) == 2 and {s.arm for s in report.samples} == {"route"}
    assert report.served == {"checked": 2, "identical": 2}
    assert "bit for bit, on 2 of 2 captured" in render_table(report)


def test_native_live_broken_host_preparation_is_outside_naming_the_layer(
    serve_native: Any, seeded_checkpoint: Path
) -> None:
    capture_dir, _ = serve_native(fault="zero-point-off-by-one")
    report = compare_captures(capture_dir, _report(seeded_checkpoint), arms=["route"])
    assert report.verdict == "outside"
    worst = report.worst()
    assert worst is not None and worst.layer == 1
    assert {s.status for s in report.samples if s.layer == 0} == {"within"}


def test_native_layer_the_host_declined_is_never_captured(
    serve_native: Any, seeded_checkpoint: Path
) -> None:
    capture_dir, layers = serve_native(sm70_awq_qwen38_qpn_m1=False)
    assert [layer.host_route_calls for layer in layers] == [[(1, 2560)]] * 2  # legacy served
    assert list(capture_dir.rglob("*.npz")) == []
    report = compare_captures(capture_dir, _report(seeded_checkpoint), arms=["route"])
    assert report.verdict == "nothing examined" and report.served is None


def test_native_server_output_that_is_not_the_route_is_said(
    serve_native: Any, seeded_checkpoint: Path, host_op: Any
) -> None:
    # A host that admits the layer but serves the call with something else: here its op writes
    # a constant when the host calls it, the correct result when qpnserve's capture calls it.
    calls: list[int] = []

    def serves_badly_once_per_layer(*args: Any) -> None:
        calls.append(1)
        if len(calls) % 2 == 1:  # the host's own call comes first
            args[0].fill_(HOST_ROUTE_VALUE)
            args[1].fill_(HOST_ROUTE_VALUE)
        else:
            host_ops.ours(*args)

    host_op.implementation[host_ops.M1] = serves_badly_once_per_layer
    capture_dir, _ = serve_native()
    report = compare_captures(capture_dir, _report(seeded_checkpoint), arms=["route"])
    # The route's numerics (run by the capture) are within, but it did not serve: not a pass.
    assert {s.status for s in report.samples} == {"within"}
    assert report.served == {"checked": 2, "identical": 0}
    assert report.verdict == "incomplete" and int(report.exit_code) == 1
    assert "2 were served by something else than the route" in render_table(report)
    assert report.summary().startswith("NOT A PASS: the route served 0 of 2 captured")


def test_native_capture_failure_is_one_warning_and_the_host_serves_on(
    serve_native: Any, host_op: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def host_serves_then_fails(*args: Any) -> None:
        if torch.isnan(args[0]).all():  # qpnserve's call: NaN-filled out
            raise RuntimeError("CUDA error: an illegal memory access")
        host_ops.ours(*args)

    host_op.implementation[host_ops.M1] = host_serves_then_fails
    caplog.set_level(logging.WARNING, logger="vllm.qpnserve_awq_m1")
    capture_dir, layers = serve_native()
    assert [layer.native_route_calls for layer in layers] == [1, 1]
    assert list(capture_dir.rglob("*.npz")) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "capturing model.language_model.layers.0" in warnings[0]


def test_native_observer_without_verify_leaves_the_hook_alone(
    native_host: FakeHost,  # noqa: F811
    report_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.delenv(VERIFY_CAPTURE_DIR.name, raising=False)
    cls = native_host.host_class()
    hook = cls.__dict__[HOOK]
    register()
    assert cls.__dict__[MARKER]["mode"] == "observe"
    assert cls.__dict__[HOOK] is hook
    assert HOOK not in cls.__dict__[MARKER]["originals"]


@pytest.mark.parametrize(
    ("scales", "label"),
    [
        (torch.zeros(1, 80, 320, dtype=torch.int32), "4byte"),
        (torch.zeros(1, 80, 320, 3, dtype=torch.uint8), "3byte"),
        (torch.zeros(1, 80, 160, 5, dtype=torch.uint8), "int4-zero"),  # ReVolta's repacked
    ],
)
def test_capture_labels_the_metadata_format_as_served(scales: Any, label: str) -> None:
    from qpnserve.dispatch.capture import _meta_format

    assert _meta_format(types.SimpleNamespace(w13_tm_scales=scales)) == label
