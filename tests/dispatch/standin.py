"""A stand-in of the patchable host class, installed as a fake ``vllm`` tree for the tests.

What it copies from 1Cat-vLLM v1.3.0 (vllm/model_executor/layers/quantization/awq_sm70_moe.py),
written from the facts, not from the code:
- the import path ``vllm.model_executor.layers.quantization.awq_sm70_moe.AWQSM70MoEMethod``;
- the method names and parameter lists the patch touches (checked against the manifest's
  recorded v1.3.0 signatures by test_standin_signatures_match_the_manifest):
  ``process_weights_after_loading(self, layer)``,
  ``_apply_legacy_single_token_compact(self, layer, x, topk_weights, topk_ids_i32, buffers,
  top_k, output)``, ``apply(self, layer, x, topk_weights, topk_ids, shared_experts,
  shared_experts_input)``;
- what process_weights_after_loading leaves on the layer: the four prepared banks
  (``w13_tm_weight``, ``w13_tm_scales``, ``w2_tm_weight``, ``w2_tm_scales``) and the scalar
  facts derived from their shapes the same way v1.3.0 derives them (``sm70_num_experts`` =
  banks' E, ``sm70_w13_k_dim`` = W13 rows, ``sm70_w13_n_dim`` = W13 words x 8, ``sm70_w2_*``
  likewise, ``sm70_hidden_logical_size``), plus the three route booleans
  ``sm70_awq_moe_batched_gemm``, ``sm70_awq_moe_w13_interleaved``,
  ``sm70_awq_moe_legacy_single_token_compact``; ``group_size`` on the method;
- apply(): one token goes to the hook with ``buffers["output"]`` (1, hidden) and
  ``buffers["intermediate"]`` (tokens x top_k, 160) fp16; other token counts take another route.

What it does not copy: the real weight preparation (the test hands over prepared banks in
``layer.stand_in_prepared``), the CUDA kernels (the host's own routes just fill ``output`` with a
sentinel and count the call, so a test can tell which route ran), buffer pools, logging.
Test-only knobs: ``layer.stand_in_overrides`` (attributes set after the host's own, to break one
init requirement at a time) and ``NATIVE = True`` (a native build: it also sets
``layer.sm70_awq_qwen38_qpn_m1``, the native host's per-layer decision, and its hook calls
``torch.ops._C.awq_moe_qpn_m1_sm70_out`` for an admitted one-token call of a layer with
``stand_in_host_op`` set, the op tests/support/host_ops.py defines; otherwise it writes the
sentinel like the legacy route).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HOST_ROUTE_VALUE = 7.0  # what the stand-in's original hook writes into output
GROUPED_ROUTE_VALUE = 3.0  # what the stand-in's many-token route writes into output

STANDIN_SOURCE = '''
"""Stand-in of 1Cat-vLLM v1.3.0's AWQSM70MoEMethod for qpnserve's dispatch tests (not vLLM)."""

import torch

NATIVE = False
HOST_ROUTE_VALUE = 7.0
GROUPED_ROUTE_VALUE = 3.0


class AWQSM70MoEMethod:
    def __init__(self, weight_bits, group_size, zero_point, layer):
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.zero_point = zero_point
        self.pack_factor = 32 // weight_bits
        self.moe = layer.moe_config

    def process_weights_after_loading(self, layer):
        prepared = layer.stand_in_prepared
        for name in ("w13_tm_weight", "w13_tm_scales", "w2_tm_weight", "w2_tm_scales"):
            setattr(layer, name, prepared[name])
        layer.sm70_num_experts = int(layer.w13_tm_weight.shape[0])
        layer.sm70_hidden_logical_size = int(layer.w13_tm_weight.shape[1])
        layer.sm70_w13_k_dim = int(layer.w13_tm_weight.shape[1])
        layer.sm70_w13_n_dim = int(layer.w13_tm_weight.shape[2]) * self.pack_factor
        layer.sm70_w2_k_dim = int(layer.w2_tm_weight.shape[1])
        layer.sm70_w2_n_dim = int(layer.w2_tm_weight.shape[2]) * self.pack_factor
        layer.sm70_intermediate_size = layer.sm70_w2_k_dim
        layer.sm70_awq_moe_batched_gemm = True
        layer.sm70_awq_moe_w13_interleaved = True
        layer.sm70_awq_moe_legacy_single_token_compact = True
        if NATIVE:
            layer.sm70_awq_qwen38_qpn_m1 = True
        for name, value in layer.stand_in_overrides.items():
            setattr(layer, name, value)
        layer.host_init_calls += 1

    def _apply_legacy_single_token_compact(
        self, layer, x, topk_weights, topk_ids_i32, buffers, top_k, output
    ):
        if (
            NATIVE
            and getattr(layer, "sm70_awq_qwen38_qpn_m1", False)
            and tuple(x.shape) == (1, 2560)
            and layer.stand_in_host_op
        ):
            layer.native_route_calls += 1
            torch.ops._C.awq_moe_qpn_m1_sm70_out(
                output, buffers["intermediate"], x, layer.w13_tm_weight, layer.w13_tm_scales,
                layer.w2_tm_weight, layer.w2_tm_scales, topk_ids_i32, topk_weights,
            )
            return output
        layer.host_route_calls.append(tuple(x.shape))
        output.fill_(HOST_ROUTE_VALUE)
        return output

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        num_tokens = x.shape[0]
        top_k = topk_ids.shape[1]
        buffers = {
            "output": torch.zeros(num_tokens, layer.sm70_hidden_logical_size, dtype=torch.float16,
                                  device=x.device),
            "intermediate": torch.empty(num_tokens * top_k, layer.sm70_intermediate_size,
                                        dtype=torch.float16, device=x.device),
        }
        output = buffers["output"]
        topk_ids_i32 = topk_ids.to(torch.int32)
        if (
            num_tokens == 1
            and layer.sm70_awq_moe_batched_gemm
            and layer.sm70_awq_moe_legacy_single_token_compact
        ):
            return self._apply_legacy_single_token_compact(
                layer, x, topk_weights, topk_ids_i32, buffers, top_k, output
            )
        output.fill_(GROUPED_ROUTE_VALUE)
        return output
'''

NATIVE_ENVS = 'environment_variables = {"VLLM_SM70_AWQ_QWEN38_QPN_M1": lambda: True}\n'
NATIVE_OPS = 'NATIVE_OP = "awq_moe_qpn_m1_sm70_out"\n'
MODULE = "vllm.model_executor.layers.quantization.awq_sm70_moe"
MODULE_RELPATH = "model_executor/layers/quantization/awq_sm70_moe.py"


@dataclass
class FakeHost:
    site: Path  # goes on sys.path
    package_dir: Path  # site/vllm

    @property
    def module_file(self) -> Path:
        return self.package_dir / MODULE_RELPATH

    def host_class(self) -> Any:
        import importlib

        return importlib.import_module(MODULE).AWQSM70MoEMethod

    def edit_source(self, old: str, new: str) -> None:
        """Change the installed stand-in source (drift); must be called before the import."""
        text = self.module_file.read_text()
        assert old in text
        self.module_file.write_text(text.replace(old, new))


def write_fake_host(
    site: Path, *, version: str = "1.3.0", native: bool = False, with_hook: bool = True
) -> FakeHost:
    """An installed-looking tree: site/vllm/... (importable) and site/1cat_vllm-*.dist-info."""
    pkg = site / "vllm"
    quant = pkg / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    for folder in (pkg, pkg / "model_executor", pkg / "model_executor" / "layers", quant):
        (folder / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(NATIVE_ENVS if native else "environment_variables = {}\n")
    if native:
        from tests.preflight.fake_host import NATIVE_LIBRARY

        (pkg / "_custom_ops.py").write_text(NATIVE_OPS)
        (pkg / "_C.abi3.so").write_bytes(NATIVE_LIBRARY)
    source = STANDIN_SOURCE.replace("NATIVE = False", f"NATIVE = {native}")
    if not with_hook:
        source = source.replace("def _apply_legacy_single_token_compact(", "def _other_route(")
    (quant / "awq_sm70_moe.py").write_text(source)
    info = site / f"1cat_vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: 1cat-vllm\nVersion: {version}\n")
    (info / "RECORD").write_text("vllm/__init__.py,,\n")
    return FakeHost(site=site, package_dir=pkg.resolve())


def forget_vllm_modules() -> None:
    """Drop every imported ``vllm`` module, so the next import reads the current fake tree."""
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


# --- the layer ------------------------------------------------------------------------------


def prepared_banks(
    *, metadata: str = "int32", num_experts: int = 512, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Banks with the prepared shapes of contract section 3, uninitialised.

    torch.empty leaves the ~400 MB of one layer's banks untouched (the pages are only mapped),
    so shape and identity tests cost no memory; numerics tests write the experts they route to.
    """
    e, d = num_experts, device
    if metadata == "int32":
        s13 = torch.empty(e, 80, 320, dtype=torch.int32, device=d)
        s2 = torch.empty(e, 5, 2560, dtype=torch.int32, device=d)
    else:
        s13 = torch.empty(e, 80, 320, 3, dtype=torch.uint8, device=d)
        s2 = torch.empty(e, 5, 2560, 3, dtype=torch.uint8, device=d)
    return {
        "w13_tm_weight": torch.empty(e, 2560, 40, dtype=torch.int32, device=d),
        "w13_tm_scales": s13,
        "w2_tm_weight": torch.empty(e, 160, 320, dtype=torch.int32, device=d),
        "w2_tm_scales": s2,
    }


@dataclass
class StandInLayer:
    """The attributes of vLLM's FusedMoE layer that the host method and the patch read."""

    stand_in_prepared: dict[str, torch.Tensor]
    layer_name: str = "model.language_model.layers.0.mlp.experts"
    moe_config: Any = field(default_factory=lambda: types.SimpleNamespace(tp_size=4, tp_rank=0))
    stand_in_overrides: dict[str, Any] = field(default_factory=dict)
    host_init_calls: int = 0
    host_route_calls: list[tuple[int, ...]] = field(default_factory=list)
    # Native stand-in only: its hook calls the host op (tests/support/host_ops.py, which the
    # test must have defined) instead of writing the sentinel.
    stand_in_host_op: bool = False
    native_route_calls: int = 0


def one_token_call(num_tokens: int = 1) -> dict[str, torch.Tensor]:
    """Arguments of one hook call for ``num_tokens`` tokens, shaped as v1.3.0's apply() makes them:
    x (n, 2560) fp16, topk_weights (n, 10) fp32, topk_ids_i32 (n, 10) int32, output (n, 2560)
    fp16, intermediate (n*10, 160) fp16."""
    n = num_tokens
    return {
        "x": torch.zeros(n, 2560, dtype=torch.float16),
        "topk_weights": torch.zeros(n, 10, dtype=torch.float32),
        "topk_ids_i32": torch.zeros(n, 10, dtype=torch.int32),
        "output": torch.zeros(n, 2560, dtype=torch.float16),
        "intermediate": torch.empty(n * 10, 160, dtype=torch.float16),
    }


class SpyOperator:
    """Records every call of the operator and writes a marker value into ``out``."""

    VALUE = 5.0

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)
        args[0].fill_(self.VALUE)
