"""Live verify's capture: the real inputs and outputs of the wrapped one-token MoE call, per rank.

Active only when `qpnserve verify` (live mode) starts the server with
$QPNSERVE_VERIFY_CAPTURE_DIR set; otherwise ``capture_from_settings`` is None and the wrapped
call does nothing more than before. Live verify serves eagerly (no CUDA graphs), so the layer's
Python runs on every decode step.

Arming: verify writes the prompt's index into ``<dir>/armed`` just before it sends that prompt
and removes it after; while armed, the first admitted one-token call of each MoE layer on each
rank is captured (the prompt's first decode step), once per (layer, prefix). Start-up, warm-up
and readiness calls happen while nothing is armed and are never captured.

Per capture, ``<dir>/rank<r>/<layer>.p<prefix>.<arm>.npz`` holds x (1, 2560) fp16, ids (1, 10)
int32, weights (1, 10) fp32, out (1, 2560) fp16, intermediate (10, 160) fp16, the layer name and
the banks' metadata format, written atomically. Arms: ``route`` (the operator's output the
server used) and, on a patched host, ``legacy``: the host's original route run on copies of the
output and scratch (the server's own output is untouched). Capturing never stops serving: a
failure is one warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qpnserve.config import Settings
from qpnserve.dispatch.recorder import layer_name, tp_rank_and_size

logger = logging.getLogger("vllm.qpnserve_awq_m1")

ARMED_FILE = "armed"
TOP_K = 10


def capture_path(directory: Path, rank: int, layer: str, prefix: int, arm: str) -> Path:
    return directory / f"rank{rank}" / f"{layer}.p{prefix}.{arm}.npz"


class Capture:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: set[tuple[int, str, int]] = set()  # (rank, layer, prefix)
        self.warned = False

    def armed_prefix(self) -> int | None:
        try:
            return int((self.directory / ARMED_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def after_route(
        self,
        method: Any,
        layer: Any,
        call: tuple[Any, Any, Any, dict[str, Any], int],  # x, weights, ids, buffers, top_k
        output: Any,
        intermediate: Any,
        original_hook: Callable[..., Any] | None,
    ) -> None:
        """Called after the operator wrote ``output``/``intermediate`` of an admitted call."""
        prefix = self.armed_prefix()
        if prefix is None or _graph_capturing(output):
            return  # a copy to the host inside a CUDA-graph capture is illegal; verify is eager
        name = layer_name(layer)
        rank = tp_rank_and_size(layer)[0]
        if (rank, name, prefix) in self.seen:
            return
        self.seen.add((rank, name, prefix))
        try:
            x, weights, ids, buffers, top_k = call
            fmt = "3byte" if str(layer.w13_tm_scales.dtype).endswith("uint8") else "4byte"
            self._save(rank, name, prefix, "route", fmt, (x, ids, weights, output, intermediate))
            if original_hook is not None:
                legacy_out = output.clone()
                legacy_buffers = {
                    k: (v.clone() if hasattr(v, "clone") else v) for k, v in buffers.items()
                }
                original_hook(method, layer, x, weights, ids, legacy_buffers, top_k, legacy_out)
                legacy_h = legacy_buffers["intermediate"][:TOP_K]
                self._save(
                    rank, name, prefix, "legacy", fmt, (x, ids, weights, legacy_out, legacy_h)
                )
        except Exception as exc:  # observe only: never break the server's decode step
            if not self.warned:
                self.warned = True
                logger.warning("qpnserve verify: capturing %s failed: %s", name, exc)

    def _save(
        self, rank: int, name: str, prefix: int, arm: str, fmt: str, tensors: tuple[Any, ...]
    ) -> None:
        import numpy as np

        x, ids, weights, out, inter = (t.detach().cpu().numpy() for t in tensors)
        path = capture_path(self.directory, rank, name, prefix, arm)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(
            tmp, x=x, ids=ids, weights=weights, out=out, intermediate=inter, layer=name,
            meta_format=fmt, rank=rank, prefix=prefix, arm=arm,
        )  # fmt: skip
        os.replace(tmp, path)


def _graph_capturing(tensor: Any) -> bool:
    if not getattr(tensor, "is_cuda", False):
        return False
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def capture_from_settings(settings: Settings) -> Capture | None:
    """This rank's capture when live `verify` asked for one, else None."""
    directory = settings.verify_capture_dir
    return Capture(directory) if directory is not None else None
