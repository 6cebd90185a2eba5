"""GPU: live verify's native capture and `verify --offline --op host` on CUDA tensors (run with
-m gpu). The host's op is the stand-in of tests/support/host_ops.py over the CUDA extension (the
real one is sm_70 SASS only); what runs on the GPU is qpnserve's side: the observer's wrapper,
the capture's NaN-filled tensors, the served-output comparison, the graph-capture guard, and
the offline probe and samples.
Run with: pytest -m gpu tests/verify
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from qpnserve import host as host_module
from qpnserve.cli import app
from qpnserve.config import ROUTE_FLAG, VERIFY_CAPTURE_DIR
from qpnserve.dispatch.capture import ARMED_FILE
from qpnserve.host import HostInfo
from qpnserve.plugin import register
from qpnserve.verify.export import Checkpoint
from qpnserve.verify.live import compare_captures
from qpnserve.verify.report import VerifyReport
from qpnserve.verify.samples import sample
from tests.dispatch.conftest import _flag_unset, native_host, report_dir  # noqa: F401
from tests.dispatch.standin import FakeHost
from tests.support import host_ops
from tests.verify.layers import layer_from_export

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_extension")]
RANK = 3


@pytest.fixture
def native_cuda(
    seeded_checkpoint: Path,
    native_host: FakeHost,  # noqa: F811
    report_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Any:
    host_ops.define()
    host_ops.reset()
    capture_dir = tmp_path / "capture"
    capture_dir.mkdir()
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.setenv(VERIFY_CAPTURE_DIR.name, str(capture_dir))
    register()
    cls = native_host.host_class()
    ck = Checkpoint(seeded_checkpoint)

    def layer_call(layer: int) -> tuple[Any, Any, tuple[Any, ...]]:
        host_layer = layer_from_export(ck, layer, RANK, fmt="3byte", prefixes=[0], device="cuda")
        method = cls(4, 32, True, host_layer)
        method.process_weights_after_loading(host_layer)
        s = sample(layer, 0)
        args = (
            torch.from_numpy(s.x).view(1, 2560).cuda(),
            torch.from_numpy(s.weights).view(1, 10).cuda(),
            torch.from_numpy(s.ids).view(1, 10).cuda(),
        )
        return method, host_layer, args

    yield capture_dir, layer_call
    host_ops.reset()


def test_gpu_native_capture_on_cuda_passes_and_the_route_served(
    native_cuda: Any, seeded_checkpoint: Path
) -> None:
    capture_dir, layer_call = native_cuda
    for layer in (0, 1):
        method, host_layer, (x, weights, ids) = layer_call(layer)
        (capture_dir / ARMED_FILE).write_text("0")
        method.apply(host_layer, x, weights, ids, None, None)
        (capture_dir / ARMED_FILE).unlink()
        assert host_layer.native_route_calls == 1
    report = VerifyReport(
        mode="live", model=str(seeded_checkpoint), operator="test", banks="test", cost="test",
        layers=[0, 1], prefixes=[0], ranks=[RANK], meta_formats=["3byte"],
    )  # fmt: skip
    report = compare_captures(capture_dir, report, arms=["route"])
    assert report.verdict == "pass", report.summary()
    assert report.served == {"checked": 2, "identical": 2}


def test_gpu_native_capture_never_copies_inside_a_cuda_graph(
    native_cuda: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture_dir, layer_call = native_cuda
    method, host_layer, (x, weights, ids) = layer_call(0)
    caplog.set_level(logging.WARNING, logger="vllm.qpnserve_awq_m1")
    method.apply(host_layer, x, weights, ids, None, None)  # warm-up, disarmed
    (capture_dir / ARMED_FILE).write_text("0")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = method.apply(host_layer, x, weights, ids, None, None)
    graph.replay()
    torch.cuda.synchronize()
    assert list(capture_dir.rglob("*.npz")) == []  # armed, but inside a capture: no copy
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert torch.isfinite(out.float()).all()


def test_gpu_offline_runs_the_native_op_and_the_converters_on_cuda(
    seeded_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_ops.define()
    host_ops.reset()
    package = tmp_path / "vllm"
    package.mkdir()
    native = HostInfo(
        found=True, dist_name="revolta", version="0.1.4", kind="native", package_dir=package
    )
    monkeypatch.setattr(host_module, "detect_host", lambda: native)
    result = CliRunner().invoke(
        app,
        ["verify", "--offline", "--model", str(seeded_checkpoint), "--device", "cuda",
         "--layers", "1", "--op", "host", "--banks", "host", "--meta-format", "3byte", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["operator"].endswith("(revolta 0.1.4) on the GPU")
    assert doc["banks"].startswith("banks prepared by the host's own converter")
    assert doc["counts"] == {"samples": 12, "within": 12, "outside": 0, "refused": 0}
