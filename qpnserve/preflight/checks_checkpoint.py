"""The checkpoint checks: pure functions of CheckpointFacts -> CheckResult.

What the AWQ M1 route needs from the checkpoint is contract section 1 (layout.py holds the
numbers): 512 experts, top-10, hidden 2560, intermediate 640 (160 per rank at TP4), AWQ 4-bit
with zero points in GEMM packing at group 32, and every expert tensor of every MoE layer.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from qpnserve.preflight import layout
from qpnserve.preflight.facts import CheckpointFacts
from qpnserve.preflight.report import CheckResult
from qpnserve.preflight.report import result as _r

MAX_NAMED_OFFENDERS = 3
RECOPY_FIX = "re-copy the checkpoint (compare file sizes with the source)"
REQUANTIZE_FIX = (
    "use the native AWQ group-32 export of Qwen3.8 (4-bit, zero point, GEMM); "
    "other quantizations keep the host's own route"
)


def _moe_setup(ck: CheckpointFacts) -> tuple[Mapping[str, Any], list[int], str] | None:
    """(text config, MoE layer indices, tensor-name layer prefix) or None without a config."""
    if ck.config is None:
        return None
    tc = layout.text_config(ck.config)
    prefix = next(
        (p for p in layout.LAYER_PREFIXES if any(n.startswith(p) for n in _sample(ck))),
        layout.DEFAULT_LAYER_PREFIX,
    )
    return tc, layout.moe_layer_indices(tc), prefix


def _sample(ck: CheckpointFacts) -> list[str]:
    # Enough names to tell the prefix without walking the whole table.
    out = []
    for name in ck.tensors:
        out.append(name)
        if len(out) >= 64:
            break
    return out


def _not_converted(ck: CheckpointFacts) -> list[str]:
    q = layout.quant_config(ck.config or {}) or {}
    raw = q.get("modules_to_not_convert") or []
    # A bare string would iterate as characters and match every layer.
    return [m for m in raw if isinstance(m, str)] if isinstance(raw, list) else []


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
    if ck.config is None:
        return _r(name, "FAIL", ck.config_error or "config.json missing", "restore config.json")
    setup = _moe_setup(ck)
    assert setup is not None
    tc, moe_layers, _ = setup
    problems = []
    for key, want in (
        ("num_experts", layout.NUM_EXPERTS),
        ("num_experts_per_tok", layout.TOP_K),
        ("hidden_size", layout.HIDDEN_SIZE),
    ):
        if tc.get(key) != want:
            problems.append(f"{key} {tc.get(key)} (needs {want})")
    inter = tc.get("moe_intermediate_size")
    per_rank = None
    if not isinstance(inter, int) or tp < 1 or inter % tp:
        problems.append(f"moe_intermediate_size {inter} is not divisible by TP {tp}")
    else:
        per_rank = inter // tp
        if per_rank != layout.INTERMEDIATE_PER_RANK_TP4:
            problems.append(
                f"moe_intermediate_size {inter} / TP {tp} = {per_rank} per rank "
                f"(the operator needs {layout.INTERMEDIATE_PER_RANK_TP4})"
            )
    if not moe_layers:
        problems.append(f"no MoE layers (num_hidden_layers {tc.get('num_hidden_layers')})")
    if problems:
        return _r(name, "FAIL", "; ".join(problems), REQUANTIZE_FIX)
    return _r(
        name,
        "PASS",
        f"{tc['num_experts']} experts, top-{tc['num_experts_per_tok']}, hidden "
        f"{tc['hidden_size']}, intermediate {inter} ({per_rank} per rank at TP{tp}), "
        f"{len(moe_layers)} MoE layers of {tc.get('num_hidden_layers')}",
    )


def check_quantization(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.quantization"
    if ck.config is None:
        return _r(name, "SKIP", "needs a readable config.json")
    q = layout.quant_config(ck.config)
    if q is None:
        return _r(name, "FAIL", "no quantization_config: not an AWQ checkpoint", REQUANTIZE_FIX)
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits", q.get("w_bit"))
    group = q.get("group_size", q.get("q_group_size"))
    zero_point = q.get("zero_point")
    version = str(q.get("version", "")).lower()
    problems = []
    if method != "awq":
        problems.append(f"quant_method {method or None!r} (needs 'awq')")
    if bits != layout.BITS:
        problems.append(f"bits {bits} (needs {layout.BITS})")
    if group != layout.GROUP_SIZE:
        problems.append(f"group_size {group} (needs {layout.GROUP_SIZE})")
    if zero_point is not True:
        problems.append(f"zero_point {zero_point} (needs true)")
    if version != "gemm":
        problems.append(f"version {version or None!r} (needs 'gemm')")
    if problems:
        return _r(name, "FAIL", "; ".join(problems), REQUANTIZE_FIX)
    return _r(name, "PASS", "AWQ 4-bit, zero point, GEMM packing, group 32")


def check_shards(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.shards"
    fix = RECOPY_FIX
    if ck.index_error is not None:
        return _r(name, "FAIL", ck.index_error, fix)
    if not ck.shards:
        return _r(name, "FAIL", "no *.safetensors shards and no index", fix)
    missing = [s.file for s in ck.shards if not s.exists]
    broken = [s for s in ck.shards if s.exists and not s.header_ok]
    problems = []
    if missing:
        problems.append(f"{len(missing)} shard(s) missing: {', '.join(missing[:3])}")
    if broken:
        problems.append(
            f"{len(broken)} shard header(s) unreadable: "
            + "; ".join(f"{s.file}: {s.error}" for s in broken[:2])
        )
    if ck.index_weight_map and not missing and not broken:
        # Every tensor the index names must be in the shard it points to.
        absent = [n for n in ck.index_weight_map if n not in ck.tensors]
        if absent:
            problems.append(f"{len(absent)} indexed tensor(s) absent from their shard: {absent[0]}")
    if problems:
        return _r(name, "FAIL", "; ".join(problems), fix)
    where = f"index {ck.index_file}" if ck.index_file else "no index"
    found = f"{len(ck.shards)} shard(s), {ck.num_tensors} tensor headers read ({where})"
    if ck.unindexed_files:
        return _r(
            name,
            "WARN",
            f"{found}; not in the index: {', '.join(ck.unindexed_files[:3])}",
            "remove stray *.safetensors files (the host loads only indexed shards)",
        )
    return _r(name, "PASS", found)


def check_tensors(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.tensors"
    setup = _moe_setup(ck)
    if setup is None:
        return _r(name, "SKIP", "needs a readable config.json")
    if ck.index_error is not None:
        return _r(name, "SKIP", "needs a readable safetensors index (see checkpoint.shards)")
    _, moe_layers, prefix = setup
    not_convert = _not_converted(ck)
    layers = [i for i in moe_layers if not layout.layer_excluded(prefix, i, not_convert)]
    if not layers:
        return _r(name, "SKIP", "no quantized MoE layer to check")
    # Tensors the index places in a shard that is missing or unreadable are counted apart:
    # their cause is the shard (checkpoint.shards), not the export.
    bad_shards = {s.file for s in ck.shards if not s.header_ok}
    shard_of = ck.index_weight_map
    counts: Counter[str] = Counter()
    named: list[str] = []  # the first offenders the export is to blame for
    unread_shards: Counter[str] = Counter()  # tensors not read because their shard is bad
    tensors = ck.tensors
    # (name, expected (dtype, shape)) pairs compared as whole tuples: 221,184 of them for the
    # full model, so the common (matching) case is one dict lookup and one tuple compare.
    suffixes = [
        (f".{s}", (spec.dtype, spec.shape)) for s, spec in layout.expert_tensor_specs().items()
    ]
    stems = [
        f"{layout.expert_prefix(prefix, layer)}.{expert}"
        for layer in layers
        for expert in range(layout.NUM_EXPERTS)
    ]
    checked = len(stems) * len(suffixes)
    for stem, (suffix, want) in itertools.product(stems, suffixes):
        tensor = stem + suffix
        found = tensors.get(tensor)
        if found == want:
            continue
        if found is None and shard_of.get(tensor) in bad_shards:
            unread_shards[shard_of[tensor]] += 1
            continue
        if found is None:
            problem, detail = "missing", "missing"
        elif found[0] != want[0]:
            problem, detail = "wrong dtype", f"dtype {found[0]} (needs {want[0]})"
        else:
            problem, detail = "wrong shape", f"shape {list(found[1])} (needs {list(want[1])})"
        counts[problem] += 1
        if len(named) < MAX_NAMED_OFFENDERS:
            named.append(f"{tensor}: {detail}")
    unread = sum(unread_shards.values())
    unread_note = (
        "in missing or unreadable shard(s) "
        f"{', '.join(sorted(unread_shards)[:MAX_NAMED_OFFENDERS])} (see checkpoint.shards)"
    )
    if counts:
        bad = sum(counts.values())
        summary = ", ".join(f"{n} {p}" for p, n in counts.most_common())
        also = f"; besides, {unread} are {unread_note}" if unread else ""
        return _r(
            name,
            "FAIL",
            f"{bad} of {checked} expert tensors differ from native group 32 ({summary}); "
            f"first: {'; '.join(named)}{also}",
            REQUANTIZE_FIX,
        )
    if unread:
        # Every tensor that was read matches: the export is fine, the copy is not.
        return _r(
            name,
            "FAIL",
            f"{unread} of {checked} expert tensors could not be checked: they are {unread_note}; "
            "the others match native group 32",
            RECOPY_FIX,
        )
    return _r(
        name,
        "PASS",
        f"{checked} expert tensors in {len(layers)} MoE layers x {layout.NUM_EXPERTS} experts "
        "match native group 32 (qweight/qzeros int32, scales fp16)",
    )


def check_coverage(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.coverage"
    setup = _moe_setup(ck)
    if setup is None:
        return _r(name, "SKIP", "needs a readable config.json")
    _, moe_layers, prefix = setup
    not_convert = _not_converted(ck)
    excluded = [i for i in moe_layers if layout.layer_excluded(prefix, i, not_convert)]
    covered = len(moe_layers) - len(excluded)
    if not moe_layers:
        return _r(name, "SKIP", "no MoE layers in config.json")
    method = str((layout.quant_config(ck.config or {}) or {}).get("quant_method", "")).lower()
    if method != "awq":
        # Unquantized (or otherwise quantized) experts run another MoE method: the route,
        # which hooks the AWQ one, would cover none of these layers.
        found = f"quant_method {method!r}" if method else "no quantization_config"
        return _r(
            name,
            "FAIL",
            f"the route covers none of the {len(moe_layers)} MoE layers: the checkpoint has "
            f"no AWQ experts ({found})",
            REQUANTIZE_FIX,
        )
    if covered == 0:
        return _r(
            name,
            "FAIL",
            "modules_to_not_convert keeps every MoE layer's experts unquantized",
            REQUANTIZE_FIX,
        )
    if excluded:
        listed = ", ".join(str(i) for i in excluded[:10]) + (" ..." if len(excluded) > 10 else "")
        return _r(
            name,
            "WARN",
            f"the route does not apply to MoE layer(s) {listed} (experts kept unquantized by "
            f"modules_to_not_convert); it covers {covered} of {len(moe_layers)} MoE layers",
            "nothing to do if intended: those layers keep the host's own route",
        )
    return _r(name, "PASS", f"the route covers all {covered} MoE layers")


# What only the route needs from a checkpoint: a server without the route loads any model the
# host can serve, so with the route off these become warnings.
ROUTE_ONLY_CHECKS = (
    "checkpoint.config",
    "checkpoint.quantization",
    "checkpoint.tensors",
    "checkpoint.coverage",
)
ROUTE_OFF_FIX = "nothing to do while the route is off: the host serves this checkpoint its own way"


def route_off(result: CheckResult) -> CheckResult:
    """A route-only FAIL, for a start without the route: a WARN that says what it means."""
    if result.name not in ROUTE_ONLY_CHECKS or result.status != "FAIL":
        return result
    return result.model_copy(
        update={
            "status": "WARN",
            "reason": f"the route cannot serve this checkpoint: {result.reason}",
            "fix": ROUTE_OFF_FIX,
        }
    )


def checkpoint_checks(
    ck: CheckpointFacts | None, tp: int, awq_m1: bool = True
) -> list[CheckResult]:
    """Every checkpoint check; ``awq_m1=False`` (a start without the route) turns the route's
    requirements into warnings, while a checkpoint the host cannot read still fails."""
    results = _all_checkpoint_checks(ck, tp)
    return results if awq_m1 else [route_off(r) for r in results]


def _all_checkpoint_checks(ck: CheckpointFacts | None, tp: int) -> list[CheckResult]:
    first = check_path(ck)
    rest = [
        "checkpoint.config",
        "checkpoint.quantization",
        "checkpoint.shards",
        "checkpoint.tensors",
        "checkpoint.coverage",
    ]
    if ck is None or first.status != "PASS":
        why = "no --model given" if ck is None else "needs a readable checkpoint directory"
        return [first, *(_r(n, "SKIP", why) for n in rest)]
    return [
        first,
        check_config(ck, tp),
        check_quantization(ck),
        check_shards(ck),
        check_tensors(ck),
        check_coverage(ck),
    ]
