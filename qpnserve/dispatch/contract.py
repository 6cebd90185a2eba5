"""Pure checks of the route's contract (contract sections 3 and 5); no side effects.

- init_contract_failures(): once per MoE layer, after the host's process_weights_after_loading,
  from the attributes the host set on the layer. Every failed requirement is returned, named.
- admission_failure(): once per call of the hook, from static tensor properties only (shape,
  dtype, contiguity, device), never from values, so a decision taken while a CUDA graph is
  captured stays true on every replay.
"""

from __future__ import annotations

from typing import Any

# Per-rank geometry of the validated deployment (Qwen3.8 AWQ g32, TP4): contract section 2.
from qpnserve.geometry import (
    GROUP,
    HIDDEN,
    INTERMEDIATE,
    NUM_EXPERTS,
    PACK,
    TOP_K,
    TP_SIZE,
    W13_N,
)

# (name on the layer, expected value): the host's own scalar facts about the prepared layer.
_LAYER_FACTS: tuple[tuple[str, object], ...] = (
    ("sm70_num_experts", NUM_EXPERTS),
    ("sm70_hidden_logical_size", HIDDEN),
    ("sm70_w13_k_dim", HIDDEN),
    ("sm70_w13_n_dim", W13_N),
    ("sm70_w2_k_dim", INTERMEDIATE),
    ("sm70_w2_n_dim", HIDDEN),
    ("sm70_awq_moe_batched_gemm", True),
    ("sm70_awq_moe_w13_interleaved", True),
    ("sm70_awq_moe_legacy_single_token_compact", True),
)

_MISSING = object()


def _bank_specs() -> dict[str, list[tuple[tuple[int, ...], Any]]]:
    """Accepted (shape, dtype) of each prepared bank: contract section 3."""
    import torch

    groups13, groups2 = HIDDEN // GROUP, INTERMEDIATE // GROUP
    return {
        "w13_tm_weight": [((NUM_EXPERTS, HIDDEN, W13_N // PACK), torch.int32)],
        "w13_tm_scales": [
            ((NUM_EXPERTS, groups13, W13_N), torch.int32),
            ((NUM_EXPERTS, groups13, W13_N, 3), torch.uint8),
        ],
        "w2_tm_weight": [((NUM_EXPERTS, INTERMEDIATE, HIDDEN // PACK), torch.int32)],
        "w2_tm_scales": [
            ((NUM_EXPERTS, groups2, HIDDEN), torch.int32),
            ((NUM_EXPERTS, groups2, HIDDEN, 3), torch.uint8),
        ],
    }


def _describe(tensor: Any) -> str:
    shape = tuple(getattr(tensor, "shape", ()))
    return f"{shape} {str(getattr(tensor, 'dtype', type(tensor).__name__)).replace('torch.', '')}"


def checkpoint_group_size(layer: Any, method: Any) -> Any:
    """The checkpoint's AWQ group. Newer hosts record it on the layer; v1.3.0 does not, and
    there the method's group_size *is* the checkpoint's (it comes from quantization_config and
    the banks are prepared at that group), so the method's value stands for both."""
    return getattr(layer, "sm70_awq_checkpoint_group_size", getattr(method, "group_size", None))


def arch_failure(device: Any, operator_archs: tuple[str, ...] | None) -> str | None:
    """Why the loaded extension cannot run on the banks' GPU, or None.

    A cubin built for sm_XY runs on the same major with minor >= Y (no PTX is shipped). Not
    checked (None) for CPU tensors or when the build's arch list is unknown. Called after the
    host put its banks on the GPU, so asking the device's capability initialises nothing new.
    """
    if operator_archs is None or getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    for arch in operator_archs:
        built_major, built_minor = (int(p) for p in arch.split("."))
        if built_major == major and built_minor <= minor:
            return None
    built = ", ".join(f"sm_{a.replace('.', '')}" for a in operator_archs) or "CPU only"
    return f"the loaded extension runs on this GPU (built for {built}, GPU is sm_{major}{minor})"


def init_contract_failures(
    layer: Any,
    method: Any,
    operator_loaded: bool,
    operator_archs: tuple[str, ...] | None = None,
) -> list[str]:
    """Every failed requirement of the init contract for one prepared layer (empty: admitted)."""
    import torch

    failures: list[str] = []
    moe_config = getattr(layer, "moe_config", None)
    tp_size = getattr(moe_config, "tp_size", _MISSING)
    if tp_size is _MISSING:
        failures.append("moe_config.tp_size is missing (need 4)")
    elif tp_size != TP_SIZE:
        failures.append(f"moe_config.tp_size == {TP_SIZE} (got {tp_size})")
    for name, expected in _LAYER_FACTS:
        value = getattr(layer, name, _MISSING)
        if value is _MISSING:
            failures.append(f"{name} is missing (need {expected})")
        elif isinstance(expected, bool):
            if bool(value) != expected:
                failures.append(f"{name} is {expected} (got {value!r})")
        elif value != expected:
            failures.append(f"{name} == {expected} (got {value!r})")
    group = getattr(method, "group_size", _MISSING)
    if group != GROUP:
        shown = "missing" if group is _MISSING else group
        failures.append(f"method group_size == {GROUP} (got {shown})")
    ckpt_group = checkpoint_group_size(layer, method)
    if ckpt_group != GROUP:
        failures.append(f"checkpoint group size == {GROUP} (got {ckpt_group})")

    banks = {name: getattr(layer, name, None) for name in _bank_specs()}
    for name, specs in _bank_specs().items():
        bank = banks[name]
        if not isinstance(bank, torch.Tensor):
            failures.append(f"{name} is a tensor (got {type(bank).__name__})")
            continue
        if not any(tuple(bank.shape) == shape and bank.dtype == dtype for shape, dtype in specs):
            wanted = " or ".join(f"{s} {str(d).replace('torch.', '')}" for s, d in specs)
            failures.append(f"{name} is {wanted} (got {_describe(bank)})")
        elif not bank.is_contiguous():
            failures.append(f"{name} is contiguous")
    s13, s2 = banks["w13_tm_scales"], banks["w2_tm_scales"]
    if isinstance(s13, torch.Tensor) and isinstance(s2, torch.Tensor) and s13.dtype != s2.dtype:
        failures.append(
            "w13_tm_scales and w2_tm_scales use one metadata format "
            f"(got {_describe(s13)} and {_describe(s2)})"
        )
    devices = {b.device for b in banks.values() if isinstance(b, torch.Tensor)}
    if len(devices) > 1:
        failures.append(f"the four banks are on one device (got {sorted(map(str, devices))})")
    if not operator_loaded:
        failures.append("the qpnserve operator is loaded")
    elif isinstance(banks["w13_tm_weight"], torch.Tensor):
        problem = arch_failure(banks["w13_tm_weight"].device, operator_archs)
        if problem:
            failures.append(problem)
    return failures


def admission_failure(x: Any, topk_weights: Any, topk_ids: Any) -> str | None:
    """Why this call is not the one physical token the operator takes, or None when it is.

    x (1, 2560) fp16, ids (1, 10) int32, weights (1, 10) fp32, each contiguous and on x's
    device. Everything else (0 or many tokens, padded graph batches, bf16, fp16 router weights,
    int64 ids, strided views) keeps the host's route.
    """
    import torch

    checks = (
        ("x", x, (1, HIDDEN), torch.float16),
        ("topk_ids", topk_ids, (1, TOP_K), torch.int32),
        ("topk_weights", topk_weights, (1, TOP_K), torch.float32),
    )
    for name, tensor, shape, dtype in checks:
        if tuple(tensor.shape) != shape:
            return f"{name} shape {tuple(tensor.shape)} != {shape}"
        if tensor.dtype != dtype:
            return f"{name} dtype {tensor.dtype} != {dtype}"
        if not tensor.is_contiguous():
            return f"{name} is not contiguous"
        if tensor.device != x.device:
            return f"{name} is on {tensor.device}, x on {x.device}"
    return None


def host_buffer_failure(output: Any, intermediate: Any, x: Any) -> str | None:
    """Why the host's own output and scratch cannot take the operator's result, or None.

    In v1.3.0 the hook is only reached with one token, so ``output`` is the host's (1, 2560)
    fp16 row and ``buffers["intermediate"]`` its (10, 160) fp16 slots; both are checked anyway
    because the operator writes into them.
    """
    import torch

    if tuple(output.shape) != (1, HIDDEN) or output.dtype != torch.float16:
        return f"output is {_describe(output)}, not (1, {HIDDEN}) float16"
    if not output.is_contiguous() or output.device != x.device:
        return "output is not contiguous on x's device"
    if intermediate.dim() != 2 or intermediate.shape[1] != INTERMEDIATE:
        return f"intermediate is {_describe(intermediate)}, not (>=10, {INTERMEDIATE})"
    if intermediate.shape[0] < TOP_K or intermediate.dtype != torch.float16:
        return f"intermediate is {_describe(intermediate)}, not (>=10, {INTERMEDIATE}) float16"
    if not intermediate.is_contiguous() or intermediate.device != x.device:
        return "intermediate is not contiguous on x's device"
    return None
