"""Live verify's capture and comparison, in process, through the real plugin on the stand-in
host class (tests/dispatch/standin.py) and the operator's CPU implementation: the wrapped
one-token call records each rank's real inputs and outputs while armed, and the comparison with
the reference decoded from the export passes, catches a broken preparation naming the layer,
catches a wrong legacy route (the stand-in's writes a sentinel), and refuses what was never
captured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG, VERIFY_CAPTURE_DIR
from qpnserve.dispatch.capture import ARMED_FILE
from qpnserve.plugin import register
from qpnserve.verify.export import Checkpoint
from qpnserve.verify.live import compare_captures
from qpnserve.verify.report import VerifyReport
from qpnserve.verify.samples import sample
from tests.dispatch.conftest import _flag_unset, fake_host, report_dir, validated_fake  # noqa: F401
from tests.dispatch.standin import FakeHost
from tests.verify.layers import layer_from_export

RANKS = [2]  # one rank other than 0 (the TP share itself is tested in test_reference.py)


@pytest.fixture
def served(
    seeded_checkpoint: Path,
    cpu_extension: Any,
    validated_fake: FakeHost,  # noqa: F811
    report_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Any:
    """Serve prefix 0 of layers 0 and 1 on ranks 0 and 3 (layer 1 prepared with ``fault``)."""
    from qpnserve.kernels import build

    capture_dir = tmp_path / "capture"
    capture_dir.mkdir()
    monkeypatch.setattr(build, "load", lambda *a, **k: cpu_extension)
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.setenv(VERIFY_CAPTURE_DIR.name, str(capture_dir))
    register()
    cls = validated_fake.host_class()
    ck = Checkpoint(seeded_checkpoint)

    def serve(fault: str | None = None, armed: bool = True) -> Path:
        for layer in (0, 1):
            for rank in RANKS:
                host_layer = layer_from_export(
                    ck, layer, rank, fault=fault if layer == 1 else None, prefixes=[0]
                )
                method = cls(4, 32, True, host_layer)
                method.process_weights_after_loading(host_layer)
                if armed:
                    (capture_dir / ARMED_FILE).write_text("0")
                s = sample(layer, 0)
                x = torch.from_numpy(s.x).view(1, 2560)
                ids = torch.from_numpy(s.ids).view(1, 10)
                weights = torch.from_numpy(s.weights).view(1, 10)
                out = method.apply(host_layer, x, weights, ids, None, None)
                assert host_layer.host_route_calls == ([(1, 2560)] if armed else [])  # legacy
                assert out.dtype == torch.float16 and out.shape == (1, 2560)
                (capture_dir / ARMED_FILE).unlink(missing_ok=True)
        return capture_dir

    return serve


def _report(ck: Path, prefixes: list[int]) -> VerifyReport:
    return VerifyReport(
        mode="live",
        model=str(ck),
        operator="test",
        banks="test",
        cost="test",
        layers=[0, 1],
        prefixes=prefixes,
        ranks=RANKS,
        meta_formats=["3byte"],
    )


def test_live_capture_of_the_route_passes(served: Any, seeded_checkpoint: Path) -> None:
    capture_dir = served()
    report = compare_captures(capture_dir, _report(seeded_checkpoint, [0]), arms=["route"])
    assert report.verdict == "pass", report.summary()
    assert len(report.examined) == 2  # 2 layers x 1 prefix x 1 rank
    assert {s.meta_format for s in report.samples} == {"3byte"}


def test_live_broken_preparation_is_outside_naming_the_layer(
    served: Any, seeded_checkpoint: Path
) -> None:
    capture_dir = served(fault="gate-up-concat")
    report = compare_captures(capture_dir, _report(seeded_checkpoint, [0]), arms=["route"])
    assert report.verdict == "outside"
    worst = report.worst()
    assert worst is not None and worst.layer == 1
    assert {s.status for s in report.samples if s.layer == 0} == {"within"}


def test_live_legacy_arm_of_the_stand_in_is_caught(served: Any, seeded_checkpoint: Path) -> None:
    # The stand-in's legacy route writes a sentinel (7.0), not the layer's output.
    capture_dir = served()
    report = compare_captures(
        capture_dir, _report(seeded_checkpoint, [0]), arms=["route", "legacy"]
    )
    assert report.verdict == "outside"
    assert {s.arm for s in report.outside} == {"legacy"}
    assert {s.status for s in report.samples if s.arm == "route"} == {"within"}


def test_live_prefix_never_captured_is_not_a_pass(served: Any, seeded_checkpoint: Path) -> None:
    capture_dir = served()
    report = compare_captures(capture_dir, _report(seeded_checkpoint, [0, 1]), arms=["route"])
    assert report.verdict == "incomplete"
    assert {s.prefix for s in report.refused} == {1}
    assert all(s.reason.startswith("not captured") for s in report.refused)


def test_live_calls_while_disarmed_capture_nothing(served: Any, seeded_checkpoint: Path) -> None:
    capture_dir = served(armed=False)
    assert list(capture_dir.rglob("*.npz")) == []
    report = compare_captures(capture_dir, _report(seeded_checkpoint, [0]), arms=["route"])
    assert report.verdict == "nothing examined"
