"""The checkpoint's shards, expert tensors and route coverage: pure functions of CheckpointFacts.

Every expert tensor of every quantized MoE layer must have native group-32 dtype and shape
(contract section 1; layout.py holds the numbers); the shards must hold what the index names.
"""

from __future__ import annotations

import itertools
from collections import Counter

from qpnserve import geometry
from qpnserve.preflight import layout
from qpnserve.preflight.checks_config import RECOPY_FIX, REQUANTIZE_FIX
from qpnserve.preflight.facts import CheckpointFacts
from qpnserve.preflight.report import CheckResult
from qpnserve.preflight.report import result as _r

MAX_NAMED_OFFENDERS = 3
NATIVE = f"native group {geometry.GROUP}"


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
    if ck.layout is None:
        return _r(name, "SKIP", "needs a readable config.json")
    if ck.index_error is not None:
        return _r(name, "SKIP", "needs a readable safetensors index (see checkpoint.shards)")
    prefix, layers = ck.layout.layer_prefix, ck.layout.quantized_moe_layers
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
        for expert in range(geometry.NUM_EXPERTS)
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
            f"{bad} of {checked} expert tensors differ from {NATIVE} ({summary}); "
            f"first: {'; '.join(named)}{also}",
            REQUANTIZE_FIX,
        )
    if unread:
        # Every tensor that was read matches: the export is fine, the copy is not.
        return _r(
            name,
            "FAIL",
            f"{unread} of {checked} expert tensors could not be checked: they are {unread_note}; "
            f"the others match {NATIVE}",
            RECOPY_FIX,
        )
    return _r(
        name,
        "PASS",
        f"{checked} expert tensors in {len(layers)} MoE layers x {geometry.NUM_EXPERTS} experts "
        f"match {NATIVE} (qweight/qzeros int32, scales fp16)",
    )


def check_coverage(ck: CheckpointFacts) -> CheckResult:
    name = "checkpoint.coverage"
    if ck.layout is None:
        return _r(name, "SKIP", "needs a readable config.json")
    moe_layers, excluded = ck.layout.moe_layers, ck.layout.unquantized_moe_layers
    covered = len(moe_layers) - len(excluded)
    if not moe_layers:
        return _r(name, "SKIP", "no MoE layers in config.json")
    method = ck.layout.quant_method
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
