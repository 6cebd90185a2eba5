"""A fake installed vLLM tree (site-packages layout) for host-detection tests."""

from __future__ import annotations

from pathlib import Path

PATCHABLE_METHOD = """
class AWQSM70MoEMethod:
    def apply(self, layer, x):
        return x

    def _apply_legacy_single_token_compact(
        self, layer, x, topk_weights, topk_ids_i32, buffers, top_k, output
    ):
        return output
"""

BARE_CLASS = "class AWQSM70MoEMethod:\n    pass\n"
NATIVE_ENVS = 'environment_variables = {\n    "VLLM_SM70_AWQ_QWEN38_QPN_M1": lambda: None,\n}\n'
NATIVE_OP_USE = 'import torch\nHAS_OP = hasattr(torch.ops._C, "awq_moe_qpn_m1_sm70_out")\n'


def make_fake_host(
    site: Path,
    *,
    dist_name: str | None = "1cat-vllm",
    version: str = "1.3.0",
    kind: str = "patched",
) -> Path:
    """Write site/vllm/... and site/<dist>.dist-info; return the vllm package dir."""
    pkg = site / "vllm"
    quant = pkg / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('a test imported vllm')\n")
    (pkg / "envs.py").write_text(
        NATIVE_ENVS if kind == "native" else "environment_variables = {}\n"
    )
    method = (
        PATCHABLE_METHOD if kind in ("patched", "native") else "class AWQSM70MoEMethod:\n    pass\n"
    )
    (quant / "awq_sm70_moe.py").write_text(method + (NATIVE_OP_USE if kind == "native" else ""))
    (pkg / "_version.py").write_text(f"__version__ = '{version}'\n")
    if dist_name is not None:
        info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        (info / "RECORD").write_text("vllm/__init__.py,,\nvllm/envs.py,,\n")
    return pkg
