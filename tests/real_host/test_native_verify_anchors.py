"""`verify` on a native host, and with a host's own bank preparation, rests on facts of the real
ReVolta 0.1.4 files; each is held here, so the stand-ins of tests/verify (the native host
class's hook, tests/support/host_ops.py) cannot drift from the host they stand for:

1. the M1 op's and both converters' registered schemas are the stand-ins', string for string;
2. the hook the observer wraps takes the parameters it passes on, in that order;
3. the hook calls the op with the arguments the capture passes, in that order;
4. the host's own admission of a call (``use_qpn_m1``, executed here on CPU tensors) agrees with
   qpnserve's ``admission_failure`` on the cases that decide it;
5. the host prepares each expert with (qweight, scales, qzeros, group, interleave), W13
   interleaved and W2 not, from the layer's w13/w2 tensors, whose W13 vLLM's loader fills as
   [gate | up] (verify/host_prepare.py cuts the same inputs from the export).
"""

from __future__ import annotations

import ast
import importlib.util
import mmap
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from qpnserve.dispatch.contract import admission_failure
from qpnserve.dispatch.wrap import HOOK, NATIVE_DECISION_ATTR
from qpnserve.host import METHOD_CLASS, METHOD_MODULE_RELPATH, method_source
from tests.support import host_ops

QUANT = "model_executor/layers/quantization"


@pytest.mark.parametrize("schema", host_ops.SCHEMAS)
def test_real_op_schemas_are_the_stand_ins(revolta_vllm: Path, schema: str) -> None:
    head = schema.partition("(")[0].encode() + b"("
    with (revolta_vllm / "_C.abi3.so").open("rb") as f, mmap.mmap(f.fileno(), 0, access=1) as m:
        start = m.find(b"\x00" + head) + 1
        assert start > 0, head
        registered = m[start : m.find(b"\x00", start)].decode()
    assert registered == schema


def _hook(revolta_vllm: Path) -> ast.FunctionDef:
    source = method_source(revolta_vllm, METHOD_MODULE_RELPATH, METHOD_CLASS, HOOK)
    assert source is not None
    node = ast.parse(source.strip() if source.startswith(" ") else source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_real_hook_takes_what_the_observer_passes(revolta_vllm: Path) -> None:
    params = [a.arg for a in _hook(revolta_vllm).args.args]
    assert params == [
        "self", "layer", "x", "topk_weights", "topk_ids_i32", "buffers", "top_k", "output"
    ]  # fmt: skip


def test_real_hook_calls_the_op_with_the_captures_argument_order(revolta_vllm: Path) -> None:
    calls = [
        node
        for node in ast.walk(_hook(revolta_vllm))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == host_ops.M1
    ]
    assert len(calls) == 1
    assert [ast.unparse(a) for a in calls[0].args] == [
        "output", "buffers['intermediate']", "x", "layer.w13_tm_weight", "layer.w13_tm_scales",
        "layer.w2_tm_weight", "layer.w2_tm_scales", "topk_ids_i32", "topk_weights",
    ]  # fmt: skip


def _use_qpn_m1(revolta_vllm: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The host's own ``use_qpn_m1``, loaded from its file with a stand-in ``vllm.envs`` (the
    function itself reads only the layer and the tensors)."""
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.envs = types.SimpleNamespace()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    path = revolta_vllm / QUANT / "awq_qpn_sm70.py"
    spec = importlib.util.spec_from_file_location("revolta_awq_qpn_sm70", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.use_qpn_m1


def _call(
    rows: int = 1, x_dtype: torch.dtype = torch.float16, ids_dtype: torch.dtype = torch.int32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.zeros(rows, 2560, dtype=x_dtype)
    return x, torch.zeros(rows, 10, dtype=torch.float32), torch.zeros(rows, 10, dtype=ids_dtype)


def test_real_host_admits_exactly_the_calls_qpnserve_admits(
    revolta_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_qpn_m1 = _use_qpn_m1(revolta_vllm, monkeypatch)
    strided = torch.zeros(2, 2560, dtype=torch.float16)[:, ::1][:1]
    wide = torch.zeros(1, 5120, dtype=torch.float16)[:, ::2]
    cases = {
        "one token": _call(),
        "two tokens": _call(rows=2),
        "bf16 x": _call(x_dtype=torch.bfloat16),
        "int64 ids": _call(ids_dtype=torch.int64),
        "strided x": (wide, *_call()[1:]),
        "a contiguous row view": (strided, *_call()[1:]),
        "fp16 weights": (_call()[0], torch.zeros(1, 10, dtype=torch.float16), _call()[2]),
    }
    admitted_layer = types.SimpleNamespace(**{NATIVE_DECISION_ATTR: True})
    for name, (x, weights, ids) in cases.items():
        host = use_qpn_m1(admitted_layer, x, weights, ids)
        ours = admission_failure(x, weights, ids) is None
        assert host == ours, name
    declined = types.SimpleNamespace(**{NATIVE_DECISION_ATTR: False})
    assert use_qpn_m1(declined, *_call()) is False
    assert sum(use_qpn_m1(admitted_layer, *c) for c in cases.values()) == 2  # the two admitted


def test_real_host_prepares_each_expert_as_verify_drives_its_converter(revolta_vllm: Path) -> None:
    source = method_source(
        revolta_vllm, METHOD_MODULE_RELPATH, METHOD_CLASS, "process_weights_after_loading"
    )
    assert source is not None
    tree = ast.parse(source.strip() if source.startswith(" ") else source)
    calls = [
        [ast.unparse(a) for a in node.args]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "prepare_awq"
    ]
    assert calls == [
        ["layer.w13_qweight[expert_id]", "layer.w13_scales[expert_id]",
         "layer.w13_qzeros[expert_id]", "self.group_size", "w13_interleaved"],
        ["layer.w2_qweight[expert_id]", "layer.w2_scales[expert_id]",
         "layer.w2_qzeros[expert_id]", "self.group_size", "False"],
    ]  # fmt: skip
    chosen = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert {"sm70_ops.awq_sm70_prepare", "sm70_ops.awq_sm70_prepare_compact"} <= chosen


def test_real_loader_fills_w13_as_gate_then_up(revolta_vllm: Path) -> None:
    source = method_source(
        revolta_vllm, "model_executor/layers/fused_moe/layer.py", "FusedMoE", "_load_w13"
    )
    assert source is not None
    text = " ".join(source.split())
    gate = 'if shard_id == "w1": expert_data = expert_data.narrow(shard_dim, 0, shard_size)'
    up = "expert_data = expert_data.narrow(shard_dim, shard_size, shard_size)"
    assert gate in text and up in text.split(gate, 1)[1]
    assert "start_offset = loaded_per_rank * tp_rank" in text  # the rank's contiguous share


def test_real_m1_kernels_read_uint8_metadata_as_the_stand_in_requires(revolta_vllm: Path) -> None:
    # The W13 kernel's parameters, mangled: (const __half* x, const unsigned* w13,
    # const unsigned char* s13, const int* ids, __half* h): 3-byte records, never int32 ones,
    # which is why host_ops.native_m1 refuses 4-byte banks and `verify --op` picks per format.
    with (revolta_vllm / "_C.abi3.so").open("rb") as f, mmap.mmap(f.fileno(), 0, access=1) as m:
        assert m.find(b"shared_qpn_w13_kernelILi1EEEvPK6__halfPKjPKhPKiPS1_") >= 0
        assert m.find(b"shared_qpn_w2_reduce_kernelILi0EEEvPK6__halfPKjPKhPKiPKfPS1_") >= 0
