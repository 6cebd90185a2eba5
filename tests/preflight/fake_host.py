"""A fake installed vLLM tree (site-packages layout) for host-detection tests."""

from __future__ import annotations

from pathlib import Path

from qpnserve.host import NATIVE_OP_SCHEMA

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
# What a native build's compiled library holds: the op's schema among other bytes.
NATIVE_LIBRARY = b"\x7fELF\x00" + NATIVE_OP_SCHEMA + b"(a!) out, Tensor(b!) intermediate) -> ()\x00"


def make_fake_host(
    site: Path,
    *,
    dist_name: str | None = "1cat-vllm",
    version: str = "1.3.0",
    kind: str = "patched",
) -> Path:
    """Write site/vllm/... and site/<dist>.dist-info; return the vllm package dir.

    kind: "native" (the op's schema in _C.abi3.so), "patched" (the hook method), "none" (the
    SM70 class without the hook), "upstream" (no SM70 AWQ MoE method at all)."""
    pkg = site / "vllm"
    quant = pkg / "model_executor" / "layers" / "quantization"
    quant.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('a test imported vllm')\n")
    (pkg / "envs.py").write_text(
        NATIVE_ENVS if kind == "native" else "environment_variables = {}\n"
    )
    method = PATCHABLE_METHOD if kind in ("patched", "native") else BARE_CLASS
    if kind != "upstream":
        (quant / "awq_sm70_moe.py").write_text(method + (NATIVE_OP_USE if kind == "native" else ""))
    if kind == "native":
        (pkg / "_C.abi3.so").write_bytes(NATIVE_LIBRARY)
    (pkg / "_version.py").write_text(f"__version__ = '{version}'\n")
    if dist_name is not None:
        info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        (info / "RECORD").write_text("vllm/__init__.py,,\nvllm/envs.py,,\n")
    return pkg
