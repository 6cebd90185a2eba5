"""qpnserve's own bank preparation: the checkpoint's AWQ export -> contract section 3's banks.

The host prepares its banks at load time (1Cat-vLLM and ReVolta call a compiled converter on
the GPU, inside the layer's process_weights_after_loading). `verify --offline` drives that
converter where the host's library runs (verify/host_prepare.py: a V100 with the host
installed); elsewhere, or with `--banks qpnserve` or `--break`, it prepares the banks here from
the same export and says so: "banks prepared by qpnserve; the host's preparation not tested".
Live mode reads the host's own banks.

Steps per expert and rank: undo the AWQ nibble order (along N), take the rank's share
(intermediate columns 160*rank.. of gate/up, the same rows of down), interleave gate and up
(prepared W13 column 2i = gate_i, 2i+1 = up_i), then pack codes and metadata with the contract's
packer (qpnserve.kernels.reference). FAULTS break one step on purpose, to show verify catches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from qpnserve.geometry import HIDDEN, INTERMEDIATE, NUM_EXPERTS, W13_N
from qpnserve.kernels import reference as packer
from qpnserve.verify.export import ExpertExport, ProjExport

FAULTS: dict[str, str] = {
    "gate-up-concat": "W13 columns as [gate | up] instead of interleaved gate/up pairs",
    "zero-point-off-by-one": "every zero point of the layer's banks one higher (mod 16)",
}
HOST_PREPARATION_NOTE = "banks prepared by qpnserve; the host's preparation not tested"

# Where each column of an 8-column AWQ group sits: column j of the group is in nibble
# _NIBBLE_OF_COLUMN[j] of its word (the inverse of the AWQ GEMM order 0, 2, 4, 6, 1, 3, 5, 7).
_NIBBLE_OF_COLUMN = np.array([0, 4, 1, 5, 2, 6, 3, 7])


def awq_codes(words: np.ndarray) -> np.ndarray:
    """(R, C/8) int32 AWQ GEMM words -> (R, C) uint8 codes in column order."""
    u = words.view(np.uint32)[..., None]  # (R, C/8, 1)
    by_nibble = (u >> (4 * np.arange(8, dtype=np.uint32))) & 0xF  # (R, C/8, 8): nibble order
    by_column = by_nibble[..., _NIBBLE_OF_COLUMN]  # (R, C/8, 8): column order within the word
    return by_column.reshape(words.shape[0], -1).astype(np.uint8)


@dataclass(frozen=True)
class Share:
    """One expert's share on one rank, in the prepared (column-interleaved) order."""

    codes_w13: np.ndarray  # (2560, 320) uint8
    scales_w13: np.ndarray  # (80, 320) float16
    zeros_w13: np.ndarray  # (80, 320) uint8
    codes_w2: np.ndarray  # (160, 2560) uint8
    scales_w2: np.ndarray  # (5, 2560) float16
    zeros_w2: np.ndarray  # (5, 2560) uint8


def _columns(proj: ProjExport, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cols = slice(INTERMEDIATE * rank, INTERMEDIATE * (rank + 1))
    words = slice(cols.start // 8, cols.stop // 8)  # 160 columns = 20 whole words
    return awq_codes(proj.qweight[:, words]), proj.scales[:, cols], awq_codes(proj.qzeros[:, words])


def _pair(gate: np.ndarray, up: np.ndarray, fault: str | None) -> np.ndarray:
    if fault == "gate-up-concat":
        return np.concatenate([gate, up], axis=1)
    paired = np.empty((gate.shape[0], 2 * gate.shape[1]), dtype=gate.dtype)
    paired[:, 0::2], paired[:, 1::2] = gate, up
    return paired


def share(expert: ExpertExport, rank: int, fault: str | None = None) -> Share:
    gq, gs, gz = _columns(expert.gate, rank)
    uq, us, uz = _columns(expert.up, rank)
    rows = slice(INTERMEDIATE * rank, INTERMEDIATE * (rank + 1))
    group_rows = slice(rows.start // 32, rows.stop // 32)
    zeros_w13 = _pair(gz, uz, fault)
    zeros_w2 = awq_codes(expert.down.qzeros[group_rows])
    if fault == "zero-point-off-by-one":
        zeros_w13, zeros_w2 = (zeros_w13 + 1) & 0xF, (zeros_w2 + 1) & 0xF
    return Share(
        codes_w13=_pair(gq, uq, fault),
        scales_w13=_pair(gs, us, fault),
        zeros_w13=zeros_w13,
        codes_w2=awq_codes(expert.down.qweight[rows]),
        scales_w2=expert.down.scales[group_rows],
        zeros_w2=zeros_w2,
    )


class Banks:
    """One layer's prepared banks on one rank, full size (512 experts, so the real expert ids
    address them), for one metadata format; only the experts written hold data.

    w13 (512, 2560, 40) int32; s13 (512, 80, 320) int32 | (512, 80, 320, 3) uint8;
    w2 (512, 160, 320) int32; s2 (512, 5, 2560) int32 | (512, 5, 2560, 3) uint8.
    """

    def __init__(self, fmt: packer.Format, device: Any, num_experts: int = NUM_EXPERTS) -> None:
        import torch

        meta_dtype, meta_tail = (torch.int32, ()) if fmt == "4byte" else (torch.uint8, (3,))
        self.fmt = fmt
        self.w13 = torch.zeros((num_experts, HIDDEN, W13_N // 8), dtype=torch.int32, device=device)
        self.s13 = torch.zeros(
            (num_experts, HIDDEN // 32, W13_N, *meta_tail), dtype=meta_dtype, device=device
        )
        self.w2 = torch.zeros(
            (num_experts, INTERMEDIATE, HIDDEN // 8), dtype=torch.int32, device=device
        )
        self.s2 = torch.zeros(
            (num_experts, INTERMEDIATE // 32, HIDDEN, *meta_tail), dtype=meta_dtype, device=device
        )
        self.filled: set[int] = set()

    def write(self, expert: int, part: Share) -> None:
        import torch

        w13 = packer.pack_codes(part.codes_w13[None])[0]
        s13 = packer.pack_meta(part.scales_w13[None], part.zeros_w13[None], self.fmt)[0]
        w2 = packer.pack_codes(part.codes_w2[None])[0]
        s2 = packer.pack_meta(part.scales_w2[None], part.zeros_w2[None], self.fmt)[0]
        for bank, data in ((self.w13, w13), (self.s13, s13), (self.w2, w2), (self.s2, s2)):
            bank[expert].copy_(torch.from_numpy(np.ascontiguousarray(data)))
        self.filled.add(expert)

    def clear(self) -> None:
        """Zero every expert written, so no stale data outlives its layer."""
        for expert in self.filled:
            for bank in (self.w13, self.s13, self.w2, self.s2):
                bank[expert].zero_()
        self.filled.clear()
