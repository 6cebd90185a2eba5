"""The host's own bank preparation, driven by `verify --offline` where the host's library runs.

1Cat-vLLM v1.3.0 and ReVolta 0.1.4 prepare each expert's banks inside the layer's
process_weights_after_loading by calling a compiled converter of their ``_C`` library:
``awq_sm70_prepare`` (4-byte metadata) or ``awq_sm70_prepare_compact`` (3-byte), with
(qweight, scales, qzeros, group_size, interleave) as vLLM's weight loader leaves them on the
layer for one expert on one rank, and taking the first two results as the banks:

- W13: qweight (2560, 40) int32 = the rank's 20 words of gate, then the rank's 20 words of up
  (vLLM's fused w13 is [gate | up]); scales (80, 320) fp16 and qzeros (80, 40) int32 likewise;
  interleave true (the host asks for gate/up column pairs);
- W2: the rank's 160 rows of down: qweight (160, 320), scales (5, 2560), qzeros (5, 320);
  interleave false.

Here those inputs are cut from the checkpoint's export (AWQ words are sliced whole, so their
nibble order is kept), the host's converter (found by verify/host_library.py) is called on them,
and its banks are what the operator reads: a preparation that disagrees with the export is then
caught against the FP64 reference. Where it cannot run (no 1Cat-vLLM or ReVolta installed; a
library that does not load or has no converter; a converter that fails on this device: the
hosts ship sm_70 kernels only) the caller prepares the banks itself (verify/prepare.py) and
says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qpnserve.geometry import GROUP, INTERMEDIATE, PACK
from qpnserve.host import HostInfo
from qpnserve.kernels.reference import Format
from qpnserve.verify import host_library
from qpnserve.verify.export import ExpertExport, VerifyError
from qpnserve.verify.prepare import Banks

CONVERTERS: dict[Format, str] = {"4byte": "awq_sm70_prepare", "3byte": "awq_sm70_prepare_compact"}
# ReVolta repacks the compact converter's records into int4-zero ones (5 bytes for two columns)
# in Python, after the converter, when this is set; verify --offline does not do that repacking.
INT4_ZERO_VAR = "VLLM_SM70_AWQ_MOE_INT4_ZERO"
INT4_ZERO_NOTE = (
    f"the host serves int4-zero banks ({INT4_ZERO_VAR}=1), repacked after its converter: "
    "offline verify does not judge that repacking, live verify does"
)


def serves_int4_zero(environ: Mapping[str, str]) -> bool:
    """As the host reads it: bool(int(value)), unset meaning 0."""
    try:
        return int(environ.get(INT4_ZERO_VAR, "0")) != 0
    except ValueError:  # the host itself would fail to start on it
        return False


@dataclass(frozen=True)
class HostPreparation:
    label: str  # "revolta 0.1.4"
    converters: dict[str, Callable[..., Any]]  # format -> the host's converter

    def describe(self, formats: Sequence[Format]) -> str:
        names = ", ".join(f"_C::{CONVERTERS[f]}" for f in formats)
        return f"banks prepared by the host's own converter ({names} of {self.label})"


def load(host: HostInfo | None, formats: Sequence[Format]) -> tuple[HostPreparation | None, str]:
    """The host's converters for ``formats``, or (None, why not) in one line."""
    names = [CONVERTERS[f] for f in formats]
    ops, why = host_library.find_ops(host, names)
    if ops is None or host is None:
        return None, why
    converters: dict[str, Callable[..., Any]] = {f: ops[CONVERTERS[f]] for f in formats}
    return HostPreparation(host_library.label(host), converters), ""


def host_inputs(expert: ExpertExport, rank: int) -> tuple[tuple[np.ndarray, ...], ...]:
    """((w13 qweight, scales, qzeros), (w2 qweight, scales, qzeros)) of one expert on one rank,
    as vLLM's loader leaves them on the layer (see the module's docstring for the shapes)."""
    cols = slice(INTERMEDIATE * rank, INTERMEDIATE * (rank + 1))
    words = slice(cols.start // PACK, cols.stop // PACK)
    gate, up, down = expert.gate, expert.up, expert.down
    w13 = (
        np.concatenate([gate.qweight[:, words], up.qweight[:, words]], axis=1),
        np.concatenate([gate.scales[:, cols], up.scales[:, cols]], axis=1),
        np.concatenate([gate.qzeros[:, words], up.qzeros[:, words]], axis=1),
    )
    group_rows = slice(cols.start // GROUP, cols.stop // GROUP)
    w2 = (down.qweight[cols], down.scales[group_rows], down.qzeros[group_rows])
    return w13, w2


def write(banks: Banks, expert: int, part: ExpertExport, rank: int, prep: HostPreparation) -> None:
    """Prepare ``expert``'s share on ``rank`` with the host's converter, into ``banks``."""
    import torch

    convert = prep.converters[banks.fmt]
    device = banks.w13.device
    prepared = []
    for inputs, interleave in zip(host_inputs(part, rank), (True, False), strict=True):
        tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in inputs]
        try:
            result = convert(*tensors, GROUP, interleave)
            if len(result) < 2:
                raise ValueError(f"it returned {len(result)} tensors, not [codes, metadata, ...]")
            prepared.append(result)
        except Exception as exc:  # a compiled converter's failure, in the host's own words
            raise VerifyError(
                f"the host's _C::{CONVERTERS[banks.fmt]} failed on expert {expert} rank {rank}: "
                f"{host_library.first_line(exc)}"
            ) from None
    (w13, s13, *_), (w2, s2, *_) = prepared
    for name, bank, got in (
        ("W13 codes", banks.w13, w13), ("W13 metadata", banks.s13, s13),
        ("W2 codes", banks.w2, w2), ("W2 metadata", banks.s2, s2),
    ):  # fmt: skip
        want = tuple(bank.shape[1:])
        if tuple(got.shape) != want or got.dtype != bank.dtype:
            raise VerifyError(
                f"the host's _C::{CONVERTERS[banks.fmt]} returned {name} as {got.dtype} "
                f"{tuple(got.shape)}; the operator reads {bank.dtype} {want} (contract section 3)"
            )
        bank[expert].copy_(got)
    banks.filled.add(expert)
