"""`verify --offline`: the route on banks prepared from the checkpoint, against the FP64
reference decoded from the same checkpoint's export, with seeded synthetic activations.

No server. Per selected MoE layer: read the experts its samples route to (as stored), compute
the reference of each sample on each rank, prepare each rank's banks (full 512-expert banks, so
the real expert ids address them; only the routed experts hold data; by the installed host's
own converter where it runs here, verify/host_prepare.py, else by qpnserve), run the operator
(the CUDA extension on a GPU, else its CPU implementation), and measure the fraction of the retained
rounding bound used (bounds.py). torch is imported here, not at the CLI's import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qpnserve.errors import UsageError
from qpnserve.geometry import HIDDEN, INTERMEDIATE, TOP_K, TP_SIZE
from qpnserve.host import HostInfo
from qpnserve.kernels.reference import FORMATS, Format
from qpnserve.verify import bounds, host_prepare, prepare, samples, sources
from qpnserve.verify.export import Checkpoint, VerifyError
from qpnserve.verify.reference import reference
from qpnserve.verify.report import SampleResult, VerifyReport

Progress = Callable[[str], None]
EXPERT_BYTES = 3 * (2560 * 80 * 4 + 80 * 80 * 4 + 80 * 640 * 2)  # one expert's nine tensors
# Seconds per unit, measured on a shared x86 CPU VM (CPU implementation, numpy reference); a GPU
# runs the op in microseconds, so there the reference and the preparation (CPU) dominate.
_S_PER_EXPERT_READ = 0.05
_S_PER_SHARE = 0.02  # one expert's share on one rank: undo AWQ packing, slice, interleave
_S_PER_BANK_WRITE = 0.02  # pack one share in one metadata format and copy it into the banks
_S_PER_REFERENCE = 1.0  # one (layer, prefix) sample on all four ranks
_S_PER_CPU_OP = 0.15


@dataclass(frozen=True)
class OfflinePlan:
    model: Path
    layers: list[int]
    prefixes: list[int]
    meta_formats: list[Format]
    ranks: list[int]
    fault: str | None = None
    fault_layer: int | None = None
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    banks: str = "auto"  # who prepares them: "auto" (the host where it can), "host", "qpnserve"
    op: str = "auto"  # which M1 op runs: "auto" (a native host's own where it can), "host", ...

    @property
    def num_samples(self) -> int:
        return len(self.layers) * len(self.prefixes) * len(self.ranks) * len(self.meta_formats)

    def num_experts(self) -> int:
        return sum(len(samples.routed_experts(layer, self.prefixes)) for layer in self.layers)

    def cost(self, on_gpu: bool) -> str:
        experts = self.num_experts()
        seconds = (
            experts * _S_PER_EXPERT_READ
            + experts * len(self.ranks) * _S_PER_SHARE
            + experts * len(self.ranks) * len(self.meta_formats) * _S_PER_BANK_WRITE
            + len(self.layers) * len(self.prefixes) * _S_PER_REFERENCE
            + (0 if on_gpu else self.num_samples * _S_PER_CPU_OP)
        )
        return (
            f"{len(self.layers)} layers x {len(self.prefixes)} prefixes x {len(self.ranks)} "
            f"ranks x {len(self.meta_formats)} metadata formats = {self.num_samples} samples; "
            f"reads {experts} experts ({experts * EXPERT_BYTES / 1e6:.0f} MB) of the checkpoint; "
            f"no server; {'one GPU' if on_gpu else 'CPU only'}; "
            f"expected about {max(1, math.ceil(seconds / 60))} min"
        )


def parse_index_list(text: str | None, allowed: list[int], what: str) -> list[int]:
    """ "0,3,5-7" -> [0, 3, 5, 6, 7]; None or "all" -> every allowed value."""
    if text is None or text.strip() == "all":
        return list(allowed)
    picked: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            picked.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise UsageError(f"--{what} {text!r} is not a list like 0,3,5-7") from None
    unknown = sorted(set(picked) - set(allowed))
    if unknown or not picked:
        shown = f"{allowed[0]}..{allowed[-1]}" if allowed else "none"
        raise UsageError(f"--{what} {text!r}: {unknown or 'empty'} not among {shown}")
    return sorted(set(picked))


def _run_op(
    op: Any, banks: prepare.Banks, sample: samples.Sample, device: Any, where: tuple[int, int]
) -> tuple[Any, Any]:
    import torch

    nan = float("nan")  # poisoned: an element the operator does not write stays NaN
    out = torch.full((1, HIDDEN), nan, dtype=torch.float16, device=device)
    inter = torch.full((TOP_K, INTERMEDIATE), nan, dtype=torch.float16, device=device)
    x = torch.from_numpy(sample.x.reshape(1, HIDDEN)).to(device)
    ids = torch.from_numpy(sample.ids.reshape(1, TOP_K)).to(device)
    weights = torch.from_numpy(sample.weights.reshape(1, TOP_K)).to(device)
    args = (out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    try:
        op(*args)
    except Exception as exc:  # a compiled op's failure (either op), named, never a traceback
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise VerifyError(
            f"the M1 op failed on layer {where[0]} rank {where[1]} ({banks.fmt} banks): {text}"
        ) from None
    return out.cpu().numpy().astype(np.float64), inter.cpu().numpy().astype(np.float64)


def judge(
    layer: int, prefix: int, rank: int, arm: str, fmt: str, out: Any, inter: Any, ref: Any
) -> SampleResult:
    """One sample's result: out (2560,) and inter (10, 160) against the rank's reference."""
    w13 = bounds.w13_use(inter, ref.h)
    w2 = bounds.w2_use(out.reshape(-1), ref.out)
    within = w13.within and w2.within
    reason = ""
    if not within:
        stage = "W13" if not w13.within else "W2"
        used = w13.fraction if stage == "W13" else w2.fraction
        reason = f"{stage} uses {used:.3g} of its bound"
        if w13.equal_share is not None and w13.equal_share < bounds.MIN_EQUAL_SHARE:
            reason += f"; h equal on {w13.equal_share:.1%} (< 98%)"
    return SampleResult(
        layer=layer,
        prefix=prefix,
        rank=rank,
        arm=arm,
        meta_format=fmt,
        status="within" if within else "outside",
        w13_fraction=w13.fraction,
        w13_equal_share=w13.equal_share,
        w2_fraction=w2.fraction,
        reason=reason,
    )


def run_offline(
    plan: OfflinePlan,
    progress: Progress,
    *,
    build_dir: Path,
    host: HostInfo | None = None,
    host_env: Mapping[str, str] | None = None,
) -> VerifyReport:
    """``build_dir``: where the prebuilt operator is (Settings.build_dir); ``host``: the
    installed host, whose own bank preparation (and, native, M1 op) run where they can;
    ``host_env``: the environment its server would get (what it prepares depends on it)."""
    ck = Checkpoint(plan.model)
    device = sources.device(plan.device)
    cost = plan.cost(device.type == "cuda")
    progress(f"verify --offline: {cost}")
    banks = {fmt: prepare.Banks(fmt, device) for fmt in plan.meta_formats}
    ops, operator = sources.operators(plan.op, host, device, build_dir, banks)
    probe_expert = ck.expert(plan.layers[0], samples.routed_experts(plan.layers[0], [0])[0])
    host_preps, banks_text = sources.banks(
        plan.banks, plan.fault, list(plan.meta_formats), plan.ranks[0], host, probe_expert, device
    )
    if host is not None and host.kind != "none" and host_prepare.serves_int4_zero(host_env or {}):
        banks_text += f"; {host_prepare.INT4_ZERO_NOTE}"
    progress(f"operator: {operator}; {banks_text}")
    report = VerifyReport(
        mode="offline",
        model=str(plan.model),
        operator=operator,
        banks=banks_text,
        cost=cost,
        layers=plan.layers,
        prefixes=plan.prefixes,
        ranks=plan.ranks,
        meta_formats=list(plan.meta_formats),
        fault=plan.fault,
        fault_layer=plan.fault_layer if plan.fault else None,
    )
    for layer in plan.layers:
        fault = plan.fault if layer == plan.fault_layer else None
        layer_samples = [samples.sample(layer, p) for p in plan.prefixes]
        experts = {e: ck.expert(layer, e) for e in samples.routed_experts(layer, plan.prefixes)}
        refs = {s.prefix: reference(s, experts, plan.ranks) for s in layer_samples}
        for rank_pos, rank in enumerate(plan.ranks):
            shares = (
                {}
                if len(host_preps) == len(plan.meta_formats)
                else {e: prepare.share(ex, rank, fault) for e, ex in experts.items()}
            )
            for fmt in plan.meta_formats:
                host_prep = host_preps.get(fmt)
                for e, ex in experts.items():
                    if host_prep is not None:
                        host_prepare.write(banks[fmt], e, ex, rank, host_prep)
                    else:
                        banks[fmt].write(e, shares[e])
                for s in layer_samples:
                    ref = refs[s.prefix][rank_pos]
                    if ref.refused:
                        result = SampleResult(
                            layer, s.prefix, rank, "route", fmt, "refused", reason=ref.refused
                        )
                    else:
                        out, inter = _run_op(ops[fmt], banks[fmt], s, device, (layer, rank))
                        result = judge(layer, s.prefix, rank, "route", fmt, out, inter, ref)
                    report.samples.append(result)
                banks[fmt].clear()
        done = [r for r in report.samples if r.layer == layer]
        progress(
            f"layer {layer}: {sum(r.status == 'within' for r in done)} within, "
            f"{sum(r.status == 'outside' for r in done)} outside, "
            f"{sum(r.status == 'refused' for r in done)} refused"
        )
    return report


def default_plan(
    model: Path,
    layers: str | None,
    prefixes: str | None,
    meta_format: str,
    fault: str | None,
    device: str,
    banks: str = "auto",
    op: str = "auto",
) -> OfflinePlan:
    """Validate the options against the checkpoint's MoE layers (UsageError: exit 2)."""
    for name, value in (("--banks", banks), ("--op", op)):
        if value not in sources.CHOICES:
            raise UsageError(f"{name} {value!r}: choose auto, host or qpnserve")
    if banks == "host" and fault is not None:
        raise UsageError(
            "--break breaks qpnserve's own preparation: it needs --banks auto or qpnserve"
        )
    if meta_format not in (*FORMATS, "both"):
        raise UsageError(f"--meta-format {meta_format!r}: choose 4byte, 3byte or both")
    if fault is not None and fault not in prepare.FAULTS:
        raise UsageError(f"--break {fault!r}: choose one of {', '.join(prepare.FAULTS)}")
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device {device!r}: choose auto, cpu or cuda")
    ck = Checkpoint(model)
    picked_layers = parse_index_list(layers, ck.moe_layers, "layers")
    picked_prefixes = parse_index_list(prefixes, list(range(samples.NUM_PREFIXES)), "prefixes")
    formats: list[Format] = list(FORMATS) if meta_format == "both" else [meta_format]  # type: ignore[list-item]
    return OfflinePlan(
        model=model,
        layers=picked_layers,
        prefixes=picked_prefixes,
        meta_formats=formats,
        ranks=list(range(TP_SIZE)),
        fault=fault,
        fault_layer=picked_layers[-1] if fault else None,
        device=device,
        banks=banks,
        op=op,
    )
