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

On a native host (ReVolta) the route runs inside the host's own hook, so the observer calls the
host's op (``torch.ops._C.awq_moe_qpn_m1_sm70_out``) itself, once, on the call's real inputs
and the layer's own banks, into fresh NaN-filled tensors: the one exception to observe-only,
made only while live `verify` arms a prompt. The capture also records whether the output the
server actually served equals that route output bit for bit (``served``): "identical" says the
host's route served the call, "differs" that something else did.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qpnserve.config import Settings
from qpnserve.dispatch.recorder import layer_name, tp_rank_and_size
from qpnserve.geometry import INTERMEDIATE, TOP_K

logger = logging.getLogger("vllm.qpnserve_awq_m1")

ARMED_FILE = "armed"


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

    def _claim(self, layer: Any, output: Any) -> tuple[int, str, int] | None:
        """(rank, layer name, armed prefix) when this call is the one to capture, else None:
        armed, not inside a CUDA-graph capture (a copy to the host there is illegal; verify
        serves eagerly), and the first call of this layer on this rank for the prefix."""
        prefix = self.armed_prefix()
        if prefix is None or _graph_capturing(output):
            return None
        key = (tp_rank_and_size(layer)[0], layer_name(layer), prefix)
        if key in self.seen:
            return None
        self.seen.add(key)
        return key

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
        claimed = self._claim(layer, output)
        if claimed is None:
            return
        rank, name, prefix = claimed
        try:
            x, weights, ids, buffers, top_k = call
            fmt = _meta_format(layer)
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
            self.warn(name, exc)

    def after_native(
        self,
        layer: Any,
        call: tuple[Any, Any, Any, dict[str, Any], int],  # x, weights, ids, buffers, top_k
        served: Any,
        native_op: Callable[..., Any],
    ) -> None:
        """Called after a native host's hook served a one-token call of a layer it admitted:
        run ``native_op`` on the call's inputs and save it as the ``route`` arm."""
        claimed = self._claim(layer, served)
        if claimed is None:
            return
        rank, name, prefix = claimed
        try:
            import torch

            x, weights, ids, _buffers, _top_k = call
            out = torch.full_like(served, float("nan"))  # an element the op skips stays NaN
            inter = torch.full(
                (TOP_K, INTERMEDIATE), float("nan"), dtype=out.dtype, device=out.device
            )
            # Tensor boundary: the host's schema (out, intermediate, input, w13, s13, w2, s2,
            # ids, topk): out (1,2560) fp16, intermediate (10,160) fp16, banks as the host
            # prepared them, ids (1,10) int32, weights (1,10) fp32.
            native_op(
                out, inter, x, layer.w13_tm_weight, layer.w13_tm_scales, layer.w2_tm_weight,
                layer.w2_tm_scales, ids, weights,
            )  # fmt: skip
            fmt = _meta_format(layer)
            same = "identical" if bool(torch.equal(out, served)) else "differs"
            self._save(rank, name, prefix, "route", fmt, (x, ids, weights, out, inter), same)
        except Exception as exc:  # observe only: never break the server's decode step
            self.warn(name, exc)

    def warn(self, name: str, exc: Exception) -> None:
        if not self.warned:  # one line per process, not one per layer
            self.warned = True
            logger.warning("qpnserve verify: capturing %s failed: %s", name, exc)

    def _save(
        self,
        rank: int,
        name: str,
        prefix: int,
        arm: str,
        fmt: str,
        tensors: tuple[Any, ...],
        served: str = "",
    ) -> None:
        import numpy as np

        x, ids, weights, out, inter = (t.detach().cpu().numpy() for t in tensors)
        path = capture_path(self.directory, rank, name, prefix, arm)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(
            tmp, x=x, ids=ids, weights=weights, out=out, intermediate=inter, layer=name,
            meta_format=fmt, rank=rank, prefix=prefix, arm=arm, served=served,
        )  # fmt: skip
        os.replace(tmp, path)


def _meta_format(layer: Any) -> str:
    """The banks' metadata format as served: 4-byte int32, 3-byte uint8 records, or a native
    host's int4-zero records (VLLM_SM70_AWQ_MOE_INT4_ZERO: uint8, 5 bytes for two columns)."""
    scales = layer.w13_tm_scales
    if not str(scales.dtype).endswith("uint8"):
        return "4byte"
    return "int4-zero" if scales.shape[-1] == 5 else "3byte"


def _graph_capturing(tensor: Any) -> bool:
    if not getattr(tensor, "is_cuda", False):
        return False
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def capture_from_settings(settings: Settings) -> Capture | None:
    """This rank's capture when live `verify` asked for one, else None."""
    directory = settings.verify_capture_dir
    return Capture(directory) if directory is not None else None
