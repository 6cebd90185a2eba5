"""The checkpoint's directory, config and quantization: pure functions of CheckpointFacts.

They read the layout the gather derived once (``ck.layout``, None without a readable
config.json) and never the files or the raw config.

What the AWQ M1 route needs from the checkpoint is contract section 1 (layout.py holds the
numbers): 512 experts, top-10, hidden 2560, intermediate 640 (160 per rank at TP4), AWQ 4-bit
with zero points in GEMM packing at group 32. The per-tensor side is checks_tensors.py.
"""

from __future__ import annotations

from qpnserve import geometry
from qpnserve.preflight.facts import CheckpointFacts
from qpnserve.preflight.report import CheckResult
from qpnserve.preflight.report import result as _r

NATIVE_QUANTIZATION = f"AWQ {geometry.BITS}-bit, zero point, GEMM packing, group {geometry.GROUP}"
# The route's operator is built for one rank of four (contract section 2).
TP_FIX = (
    f"use --tp {geometry.TP_SIZE}: the route runs at tensor parallel {geometry.TP_SIZE}, one "
    "rank per V100"
)
RECOPY_FIX = "re-copy the checkpoint (compare file sizes with the source)"
REQUANTIZE_FIX = (
    f"use the native AWQ group-{geometry.GROUP} export of Qwen3.8 ({geometry.BITS}-bit, zero "
    "point, GEMM); "
    "other quantizations keep the host's own route"
)


def check_path(ck: CheckpointFacts | None) -> CheckResult:
    name = "checkpoint.path"
    if ck is None:
        return _r(name, "SKIP", "no --model given")
    if ck.error is not None or not ck.readable:
        return _r(
            name,
            "FAIL",
            f"{ck.path} {ck.error or 'is unreadable'}",
            "pass --model the checkpoint directory (config.json, index, *.safetensors)",
        )
    return _r(name, "PASS", f"{ck.path}")


def check_config(ck: CheckpointFacts, tp: int) -> CheckResult:
    name = "checkpoint.config"
    if ck.layout is None:
        return _r(name, "FAIL", ck.config_error or "config.json missing", "restore config.json")
    tc, moe_layers = ck.layout.text, ck.layout.moe_layers
    problems = []
    for key, want in (
        ("num_experts", geometry.NUM_EXPERTS),
        ("num_experts_per_tok", geometry.TOP_K),
        ("hidden_size", geometry.HIDDEN),
    ):
        if tc.get(key) != want:
            problems.append(f"{key} {_shown(tc.get(key))} (needs {want})")
    inter = tc.get("moe_intermediate_size")
    if inter != geometry.MOE_INTERMEDIATE:
        problems.append(
            f"moe_intermediate_size {_shown(inter)} (needs {geometry.MOE_INTERMEDIATE}: "
            f"{geometry.INTERMEDIATE} per rank at TP{geometry.TP_SIZE})"
        )
    if not moe_layers:
        problems.append(f"no MoE layers (num_hidden_layers {tc.get('num_hidden_layers')})")
    wrong_tp = _tp_problem(tp)
    if problems:
        # The export is wrong whatever the TP; a wrong --tp as well is said in the same line.
        also_tp = f"; also {wrong_tp}" if wrong_tp else ""
        fix = REQUANTIZE_FIX + (f"; and {TP_FIX}" if wrong_tp else "")
        return _r(name, "FAIL", "; ".join(problems) + also_tp, fix)
    if wrong_tp:
        return _r(
            name, "FAIL", f"{wrong_tp}; the checkpoint's geometry fits, the TP does not", TP_FIX
        )
    return _r(
        name,
        "PASS",
        f"{tc['num_experts']} experts, top-{tc['num_experts_per_tok']}, hidden "
        f"{tc['hidden_size']}, intermediate {inter} ({geometry.INTERMEDIATE} per rank at "
        f"TP{tp}), {len(moe_layers)} MoE layers of {tc.get('num_hidden_layers')}",
    )


def _shown(value: object) -> str:
    # A quoted "640" says why it is not the 640 it reads as.
    return repr(value) if isinstance(value, str) else str(value)


def _tp_problem(tp: int) -> str | None:
    """Why ``tp`` cannot carry the route's operator, or None at TP 4."""
    if tp == geometry.TP_SIZE:
        return None
    inter = geometry.MOE_INTERMEDIATE
    if tp < 1 or inter % tp:
        return f"moe_intermediate_size {inter} is not divisible by TP {tp}"
    return (
        f"moe_intermediate_size {inter} / TP {tp} = {inter // tp} per rank "
        f"(the operator needs {geometry.INTERMEDIATE}, at TP{geometry.TP_SIZE})"
    )


def check_quantization(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.quantization"
    if ck.layout is None:
        return _r(name, "SKIP", "needs a readable config.json")
    q = ck.layout.quantization
    if q is None:
        return _r(name, "FAIL", "no quantization_config: not an AWQ checkpoint", REQUANTIZE_FIX)
    method = ck.layout.quant_method
    bits = q.get("bits", q.get("w_bit"))
    group = q.get("group_size", q.get("q_group_size"))
    zero_point = q.get("zero_point")
    version = str(q.get("version", "")).lower()
    problems = []
    if method != "awq":
        problems.append(f"quant_method {method or None!r} (needs 'awq')")
    if bits != geometry.BITS:
        problems.append(f"bits {bits} (needs {geometry.BITS})")
    if group != geometry.GROUP:
        problems.append(f"group_size {group} (needs {geometry.GROUP})")
    if zero_point is not True:
        problems.append(f"zero_point {zero_point} (needs true)")
    if version != "gemm":
        problems.append(f"version {version or None!r} (needs 'gemm')")
    if problems:
        return _r(name, "FAIL", "; ".join(problems), REQUANTIZE_FIX)
    return _r(name, "PASS", NATIVE_QUANTIZATION)
