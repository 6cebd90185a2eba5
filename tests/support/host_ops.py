"""Stand-ins of the host's ``_C`` ops that `verify` drives: the native M1 op
``awq_moe_qpn_m1_sm70_out`` and the bank converters ``awq_sm70_prepare`` (4-byte metadata) and
``awq_sm70_prepare_compact`` (3-byte). They are NOT ReVolta's or 1Cat-vLLM's kernels: those
ship as sm_70 SASS only (ReVolta 0.1.4's ``_C.abi3.so`` holds 52 sm_70 cubins and no PTX), which
neither this CPU machine nor an H200 can run.

What they copy from the real host: each op's name and schema, string for string as the wheel's
library registers them (tests/real_host/test_native_verify_anchors.py holds them against the
wheel). What they compute, by default:
- the M1 op: refuses int32 (4-byte) metadata as ReVolta's does, then qpnserve's operator (its
  CPU or CUDA build, which the caller must have loaded), with the same arguments in the same
  order (contract section 4);
- a converter: contract section 3's banks from one expert's AWQ tensors on one rank as vLLM's
  loader leaves them (W13 as [gate | up]; ``interleave_gated_silu`` pairs gate and up columns),
  through the contract's packer. Returns [codes, metadata, leading dims] like the host's.

So a verify through them measures the capture, the host's inputs as qpnserve cuts them, the
banks and the comparison, not a kernel of the host's. ``define()`` registers them once per
process (torch keeps a definition for the process's life); tests swap ``implementation[name]``
to make the host misbehave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

M1_SCHEMA = (
    "awq_moe_qpn_m1_sm70_out(Tensor(a!) out, Tensor(b!) intermediate, Tensor input, Tensor w13, "
    "Tensor s13, Tensor w2, Tensor s2, Tensor ids, Tensor topk) -> ()"
)
_CONVERTER_ARGS = (
    "(Tensor _kernel, Tensor _scaling_factors, Tensor _zeros, int group_size, "
    "bool interleave_gated_silu) -> Tensor[]"
)
PREPARE_SCHEMA = "awq_sm70_prepare" + _CONVERTER_ARGS
PREPARE_COMPACT_SCHEMA = "awq_sm70_prepare_compact" + _CONVERTER_ARGS
SCHEMAS = (M1_SCHEMA, PREPARE_SCHEMA, PREPARE_COMPACT_SCHEMA)
M1 = M1_SCHEMA.partition("(")[0]


def ours(*args: Any) -> None:
    import torch

    torch.ops.qpnserve.awq_moe_m1_out(*args)


def native_m1(*args: Any) -> None:
    """As ReVolta 0.1.4's op takes its banks: uint8 metadata only (its kernels read the
    metadata as ``unsigned char const*``; held by tests/real_host), then qpnserve's operator."""
    import torch

    s13, s2 = args[4], args[6]
    if s13.dtype != torch.uint8 or s2.dtype != torch.uint8:
        raise RuntimeError("awq_qpn_m1: W13 metadata dtype/shape/contiguity mismatch")
    ours(*args)


def convert(fmt: str) -> Callable[..., list[Any]]:
    def converter(
        qweight: Any, scales: Any, qzeros: Any, group_size: int, interleave: bool
    ) -> list[Any]:
        import numpy as np
        import torch

        from qpnserve.kernels import reference as packer
        from qpnserve.verify.prepare import awq_codes

        assert group_size == 32
        codes, zeros = awq_codes(qweight.cpu().numpy()), awq_codes(qzeros.cpu().numpy())
        s = scales.cpu().numpy()
        if interleave:  # [gate | up] -> gate/up column pairs
            half = codes.shape[1] // 2
            pair = lambda a: np.stack([a[:, :half], a[:, half:]], axis=2).reshape(a.shape[0], -1)  # noqa: E731
            codes, zeros, s = pair(codes), pair(zeros), pair(s)
        w = packer.pack_codes(codes[None])[0]
        meta = packer.pack_meta(s[None], zeros[None], fmt)[0]  # type: ignore[arg-type]
        lds = torch.tensor([codes.shape[0], codes.shape[1] // 8], dtype=torch.int64)
        out = [torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(meta.copy()), lds]
        return [t.to(qweight.device) for t in out]

    return converter


DEFAULTS: dict[str, Callable[..., Any]] = {
    M1: native_m1,
    "awq_sm70_prepare": convert("4byte"),
    "awq_sm70_prepare_compact": convert("3byte"),
}
implementation: dict[str, Callable[..., Any]] = dict(DEFAULTS)
_library: list[Any] = []  # the torch.library.Library, kept alive for the process


def define() -> None:
    """Register the three ``_C`` ops (CPU and CUDA) in this process, once."""
    if _library:
        return
    import torch

    library = torch.library.Library("_C", "FRAGMENT")
    for schema in SCHEMAS:
        name = schema.partition("(")[0]
        library.define(schema)
        for key in ("CPU", "CUDA"):  # the GPU tests run the stand-ins on CUDA tensors too
            library.impl(name, lambda *args, _n=name: implementation[_n](*args), key)
    _library.append(library)


def reset() -> None:
    implementation.clear()
    implementation.update(DEFAULTS)
