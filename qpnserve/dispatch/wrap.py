"""The wrappers the patch puts on the host class, and the marker that makes applying idempotent.

Patched host (route flag 1):
- process_weights_after_loading: the host's own, then the init contract for that layer; the
  decision goes to the route report; a failed requirement raises DispatchError naming the layer
  and the requirement (fail closed: vLLM stops the worker, the server does not start).
- _apply_legacy_single_token_compact: when the layer passed the contract and the call is the one
  physical token (contract.admission_failure is None), the operator writes the host's own
  ``output`` and ``buffers["intermediate"]`` from the host's own banks (no copies) and the
  host's ``output`` is returned; every other call goes to the host's original, unchanged.
- apply: a pass-through watcher (arguments, result and behaviour untouched). While the current
  CUDA stream captures a graph, it records the rows the layer saw and whether the hook admitted
  the route inside that call, into the route report (qpnserve.dispatch.graphs says why).

Native host: only an observer around process_weights_after_loading that reads the host's own
per-layer decision (``layer.sm70_awq_qwen38_qpn_m1``) into the route report, and the same
apply watcher, which there records the captured rows only (whether the host's route went into
a graph is not observable: "unknown"); the route is the host's, nothing in the dispatch changes.
Only while live `verify` runs the server does the observer also wrap the host's hook, to run
the host's op once more on a call the host served (dispatch/capture.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from qpnserve.config import ROUTE_FLAG
from qpnserve.dispatch import graphs
from qpnserve.dispatch.capture import Capture
from qpnserve.dispatch.contract import (
    TOP_K,
    admission_failure,
    host_buffer_failure,
    init_contract_failures,
)
from qpnserve.dispatch.recorder import RouteRecorder, layer_name
from qpnserve.errors import DispatchError

logger = logging.getLogger("vllm.qpnserve_awq_m1")

# On the host class: {"mode", "patch_id", "originals", "recorder"}.
MARKER = "_qpnserve_awq_m1_patch"
ADMITTED_ATTR = "qpnserve_awq_m1_admitted"  # on each layer that passed the init contract
NATIVE_DECISION_ATTR = "sm70_awq_qwen38_qpn_m1"  # the native host's own per-layer decision
HOOK = "_apply_legacy_single_token_compact"
INIT = "process_weights_after_loading"
APPLY = "apply"  # the host method that calls the hook (num_tokens == 1) or another route

# The operator: torch.ops.qpnserve.awq_moe_m1_out(out, intermediate, x, w13, s13, w2, s2, ids,
# weights) -> None (contract section 4).
Operator = Callable[..., Any]


def applied_mode(cls: type) -> str | None:
    """ "patched" or "observe" when this class already carries the patch, else None."""
    marker = cls.__dict__.get(MARKER)
    return None if marker is None else str(marker["mode"])


def install_patched(
    cls: type,
    *,
    op: Operator,
    recorder: RouteRecorder,
    patch_id: str,
    op_archs: tuple[str, ...] | None = None,
    capture: Capture | None = None,
) -> bool:
    """Wrap the init and the hook and watch apply(); False (and nothing done) when the class
    is already patched.

    ``capture``: live `verify`'s capture of the wrapped calls (None when serving).

    ``op_archs``: the loaded build's CUDA archs (() for a CPU-only build; None: not checked).
    """
    if applied_mode(cls) is not None:
        return False
    original_init = getattr(cls, INIT)
    original_hook = getattr(cls, HOOK)
    original_apply = getattr(cls, APPLY, None)
    # id(layer) -> [route admitted] while that layer's apply() is being captured.
    in_capture: dict[int, list[bool]] = {}

    @functools.wraps(original_init)
    def process_weights_after_loading(self: Any, layer: Any) -> Any:
        result = original_init(self, layer)
        if callable(original_apply) and not recorder.graphs_watched:
            recorder.watch_graphs(graphs.planned_capture_sizes())  # vLLM's config is set now
        failures = init_contract_failures(
            layer, self, operator_loaded=op is not None, operator_archs=op_archs
        )
        name = layer_name(layer)
        if failures:
            setattr(layer, ADMITTED_ATTR, False)
            recorder.record(layer, admitted=False, reason="; ".join(failures))
            raise DispatchError(
                f"{ROUTE_FLAG.name}=1 but MoE layer {name} fails the AWQ M1 init contract: "
                f"requires {failures[0]}"
                + (
                    f" (and {len(failures) - 1} more, see the route report)" if failures[1:] else ""
                ),
                hint=f"set {ROUTE_FLAG.name}=0 to serve this model without the route",
            )
        setattr(layer, ADMITTED_ATTR, True)
        recorder.record(layer, admitted=True)
        return result

    warned: set[str] = set()

    @functools.wraps(original_hook)
    def _apply_legacy_single_token_compact(
        self: Any,
        layer: Any,
        x: Any,
        topk_weights: Any,
        topk_ids_i32: Any,
        buffers: dict[str, Any],
        top_k: int,
        output: Any,
    ) -> Any:
        capturing = graphs.is_capturing(x)
        if getattr(layer, ADMITTED_ATTR, False):
            problem = admission_failure(x, topk_weights, topk_ids_i32)
            intermediate = buffers["intermediate"]
            if problem is None:
                problem = host_buffer_failure(output, intermediate, x)
            if problem is None:
                # v1.3.0 hands exactly (10, 160) slots for one token; a longer persistent
                # buffer is sliced to its first 10 rows: a view of the same storage, not a copy.
                if intermediate.shape[0] != TOP_K:
                    intermediate = intermediate[:TOP_K]
                # Tensor boundary: output (1,2560) fp16, intermediate (10,160) fp16, x (1,2560)
                # fp16, banks as prepared by the host (contract section 3), ids (1,10) int32
                # router order, weights (1,10) fp32; all contiguous, on one device.
                op(
                    output,
                    intermediate,
                    x,
                    layer.w13_tm_weight,
                    layer.w13_tm_scales,
                    layer.w2_tm_weight,
                    layer.w2_tm_scales,
                    topk_ids_i32,
                    topk_weights,
                )
                if capturing:
                    _note_capture(layer, x, admitted=True)
                if capture is not None:  # live `verify`: record this call (dispatch/capture.py)
                    call = (x, topk_weights, topk_ids_i32, buffers, top_k)
                    capture.after_route(self, layer, call, output, intermediate, original_hook)
                return output
            # One token that still misses the operator is the silent non-admission the route
            # report cannot show; say so once per distinct reason (never per call).
            if x.dim() >= 1 and x.shape[0] == 1 and problem not in warned:
                warned.add(problem)
                logger.warning(
                    "qpnserve AWQ M1: a one-token call of %s stays on the host route: %s",
                    layer_name(layer),
                    problem,
                )
        if capturing:
            _note_capture(layer, x, admitted=False)
        return original_hook(self, layer, x, topk_weights, topk_ids_i32, buffers, top_k, output)

    def _note_capture(layer: Any, x: Any, *, admitted: bool) -> None:
        pending = in_capture.get(id(layer))
        if pending is not None:  # inside the layer's apply(): it records the whole call
            pending[0] = admitted
        else:  # the hook captured without apply() around it: record it here
            recorder.record_capture(layer, int(x.shape[0]), admitted)

    originals = {INIT: original_init, HOOK: original_hook}
    setattr(cls, INIT, process_weights_after_loading)
    setattr(cls, HOOK, _apply_legacy_single_token_compact)
    if callable(original_apply):
        originals[APPLY] = original_apply

        @functools.wraps(original_apply)
        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            layer, x = _layer_and_x(args, kwargs)
            if not graphs.is_capturing(x):
                return original_apply(self, *args, **kwargs)
            in_capture[id(layer)] = [False]
            try:
                result = original_apply(self, *args, **kwargs)
                admitted = in_capture[id(layer)][0]
            finally:
                in_capture.pop(id(layer), None)
            recorder.record_capture(layer, int(x.shape[0]), admitted)
            return result

        setattr(cls, APPLY, apply)
    setattr(
        cls,
        MARKER,
        {"mode": "patched", "patch_id": patch_id, "originals": originals, "recorder": recorder},
    )
    return True


def _layer_and_x(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """apply(layer, x, ...) by position or keyword, whatever else the host version passes."""
    layer = kwargs["layer"] if "layer" in kwargs else (args[0] if args else None)
    x = kwargs["x"] if "x" in kwargs else (args[1] if len(args) > 1 else None)
    return layer, x


def install_observer(
    cls: type,
    *,
    recorder: RouteRecorder,
    capture: Capture | None = None,
    native_op: Callable[[], Operator] | None = None,
) -> bool:
    """Native host: record the host's own per-layer decision; False when already installed.

    ``capture`` (live `verify` only) also wraps the host's hook: after the host served a
    one-token call of a layer it admitted, the capture runs the host's op on that call
    (``native_op()`` resolves it then, once vLLM has loaded the host's library)."""
    if applied_mode(cls) is not None:
        return False
    original_init = getattr(cls, INIT)
    original_apply = getattr(cls, APPLY, None)
    original_hook = getattr(cls, HOOK, None)

    @functools.wraps(original_init)
    def process_weights_after_loading(self: Any, layer: Any) -> Any:
        result = original_init(self, layer)
        if callable(original_apply) and not recorder.graphs_watched:
            recorder.watch_graphs(graphs.planned_capture_sizes())
        decided = getattr(layer, NATIVE_DECISION_ATTR, None)
        if decided is None:
            recorder.record(
                layer, admitted=False, reason="native (host-decided): no per-layer decision exposed"
            )
        elif decided:
            recorder.record(layer, admitted=True)
        else:
            recorder.record(
                layer,
                admitted=False,
                reason=f"native host declined the layer ({NATIVE_DECISION_ATTR} is False)",
            )
        return result

    originals = {INIT: original_init}
    setattr(cls, INIT, process_weights_after_loading)
    if capture is not None and native_op is not None and callable(original_hook):
        originals[HOOK] = original_hook
        setattr(cls, HOOK, _native_capture_hook(original_hook, capture, native_op))
    if callable(original_apply):
        originals[APPLY] = original_apply

        @functools.wraps(original_apply)
        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:  # watching must never stop the host's own call
                layer, x = _layer_and_x(args, kwargs)
                rows = int(x.shape[0]) if graphs.is_capturing(x) else None
            except Exception:
                rows = None
            result = original_apply(self, *args, **kwargs)
            if rows is not None:
                try:
                    recorder.record_capture(layer, rows, None)  # the host's route: unobservable
                except Exception as exc:
                    logger.warning("qpnserve AWQ M1: cannot record a graph capture: %s", exc)
            return result

        setattr(cls, APPLY, apply)
    setattr(
        cls,
        MARKER,
        {"mode": "observe", "patch_id": None, "originals": originals, "recorder": recorder},
    )
    return True


def _native_capture_hook(
    original_hook: Callable[..., Any], capture: Capture, native_op: Callable[[], Operator]
) -> Callable[..., Any]:
    """The native host's hook, unchanged, then live `verify`'s capture of the call it served."""

    @functools.wraps(original_hook)
    def _apply_legacy_single_token_compact(
        self: Any,
        layer: Any,
        x: Any,
        topk_weights: Any,
        topk_ids_i32: Any,
        buffers: dict[str, Any],
        top_k: int,
        output: Any,
    ) -> Any:
        result = original_hook(self, layer, x, topk_weights, topk_ids_i32, buffers, top_k, output)
        try:  # the host's own admission: its per-layer decision and the one-token shapes
            if getattr(layer, NATIVE_DECISION_ATTR, False) is True and (
                admission_failure(x, topk_weights, topk_ids_i32) is None
            ):
                call = (x, topk_weights, topk_ids_i32, buffers, top_k)
                capture.after_native(layer, call, output, native_op())
        except Exception as exc:  # verify must never break the host's decode step
            capture.warn(layer_name(layer), exc)
        return result

    return _apply_legacy_single_token_compact


def remove(cls: type) -> bool:
    """Restore the host's original methods (tests, and a clean in-process rollback)."""
    marker = cls.__dict__.get(MARKER)
    if marker is None:
        return False
    for name, original in marker["originals"].items():
        setattr(cls, name, original)
    delattr(cls, MARKER)
    return True
