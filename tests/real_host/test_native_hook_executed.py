"""Live verify's native capture around ReVolta 0.1.4's REAL hook: the body of its
``AWQSM70MoEMethod._apply_legacy_single_token_compact`` and its admission rule ``use_qpn_m1``,
read from the wheel's files and executed here (on CPU), inside the native stand-in class in place
of the stand-in's own hook. Only what that code calls is stood in: ``sm70_ops`` (the host's op,
through tests/support/host_ops.py over qpnserve's CPU operator, and a legacy route that writes a
sentinel) and a no-op route log. So the observer wraps the host's own code, as it would in a
ReVolta server, and the capture, the comparison with the reference decoded from the export and
the served-output check run on what that code served."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.config import ROUTE_FLAG, VERIFY_CAPTURE_DIR
from qpnserve.dispatch.capture import ARMED_FILE
from qpnserve.dispatch.wrap import HOOK, NATIVE_DECISION_ATTR
from qpnserve.host import METHOD_CLASS, METHOD_MODULE_RELPATH, method_source
from qpnserve.plugin import register
from qpnserve.verify.export import Checkpoint
from qpnserve.verify.live import compare_captures
from qpnserve.verify.report import VerifyReport
from qpnserve.verify.samples import sample
from tests.dispatch.conftest import _flag_unset, native_host, report_dir  # noqa: F401
from tests.dispatch.standin import HOST_ROUTE_VALUE, FakeHost
from tests.support import host_ops
from tests.verify.conftest import seeded_checkpoint  # noqa: F401
from tests.verify.layers import layer_from_export

RANK = 2


def _real_hook(revolta_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The host's hook, defined from its own source in a namespace of stand-ins."""
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.envs = types.SimpleNamespace()  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:  # only while the module imports `from vllm import envs`
        patch.setitem(sys.modules, "vllm", fake_vllm)
        path = revolta_vllm / "model_executor/layers/quantization/awq_qpn_sm70.py"
        spec = importlib.util.spec_from_file_location("revolta_awq_qpn_sm70_exec", path)
        assert spec is not None and spec.loader is not None
        admission = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(admission)

    def legacy(output: Any, *args: Any) -> None:  # the host's legacy route: a sentinel
        output.fill_(HOST_ROUTE_VALUE)

    source = method_source(revolta_vllm, METHOD_MODULE_RELPATH, METHOD_CLASS, HOOK)
    assert source is not None
    namespace: dict[str, Any] = {
        "torch": torch,
        "RoutedExperts": Any,
        "use_qpn_m1": admission.use_qpn_m1,
        "_log_runtime_route_once": lambda *args: None,
        "sm70_ops": types.SimpleNamespace(
            awq_moe_qpn_m1_sm70_out=lambda *args: torch.ops._C.awq_moe_qpn_m1_sm70_out(*args),
            awq_moe_single_token_sm70_out=legacy,
        ),
    }
    code = textwrap.dedent(source)
    names = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    assert {"use_qpn_m1", "sm70_ops"} <= names  # the body still decides and calls as read
    exec(compile(code, str(revolta_vllm / METHOD_MODULE_RELPATH), "exec"), namespace)
    layer_attrs = {
        n.attr
        for n in ast.walk(ast.parse(code))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "layer"
    }
    return namespace[HOOK], layer_attrs


def test_native_capture_around_the_real_hook_passes_and_sees_the_route_serve(
    revolta_vllm: Path,
    seeded_checkpoint: Path,  # noqa: F811
    cpu_extension: Any,
    native_host: FakeHost,  # noqa: F811
    report_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    host_ops.define()
    host_ops.reset()
    cls = native_host.host_class()
    hook, layer_attrs = _real_hook(revolta_vllm, monkeypatch)
    monkeypatch.setattr(cls, HOOK, hook)
    capture_dir = tmp_path / "capture"
    capture_dir.mkdir()
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.setenv(VERIFY_CAPTURE_DIR.name, str(capture_dir))
    register()  # the observer wraps the real hook now on the class
    ck = Checkpoint(seeded_checkpoint)
    outputs = {}
    for layer, admitted in ((0, True), (1, False)):
        host_layer = layer_from_export(
            ck, layer, RANK, fmt="3byte", prefixes=[0], **{NATIVE_DECISION_ATTR: admitted}
        )
        method = cls(4, 32, True, host_layer)
        method.process_weights_after_loading(host_layer)
        for attr in layer_attrs:  # what the real legacy branch passes on: not read by the stub
            if not hasattr(host_layer, attr):
                setattr(host_layer, attr, None)
        s = sample(layer, 0)
        # The host's apply() hands the hook its pooled buffers; the legacy branch passes more of
        # them on (to the sentinel stub), the route reads "intermediate" (10, 160) fp16.
        buffers: dict[str, Any] = defaultdict(lambda: torch.zeros(1))
        buffers["intermediate"] = torch.empty(10, 160, dtype=torch.float16)
        output = torch.zeros(1, 2560, dtype=torch.float16)
        (capture_dir / ARMED_FILE).write_text("0")
        outputs[layer] = getattr(cls, HOOK)(  # the observer's wrapper around the real hook
            method,
            host_layer,
            torch.from_numpy(s.x).view(1, 2560),
            torch.from_numpy(s.weights).view(1, 10),
            torch.from_numpy(s.ids).view(1, 10),
            buffers,
            10,
            output,
        )
        (capture_dir / ARMED_FILE).unlink()
    assert torch.all(outputs[1] == HOST_ROUTE_VALUE)  # declined: the real hook went legacy
    assert not torch.all(outputs[0] == HOST_ROUTE_VALUE)  # admitted: the real hook's op call
    report = VerifyReport(
        mode="live", model=str(seeded_checkpoint), operator="test", banks="test", cost="test",
        layers=[0, 1], prefixes=[0], ranks=[RANK], meta_formats=["3byte"],
    )  # fmt: skip
    report = compare_captures(capture_dir, report, arms=["route"])
    assert [(s.layer, s.status) for s in report.samples] == [(0, "within"), (1, "refused")]
    assert report.served == {"checked": 1, "identical": 1}
