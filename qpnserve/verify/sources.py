"""What `verify --offline` runs, each choice said in words for the report: the device, the M1 op
(a native host's own where it runs here, else qpnserve's operator) and who prepares the banks
(the installed host's own converter where it runs here, else qpnserve).

``auto`` takes the host's part when it loads and runs on a probe here and otherwise falls back,
saying why; ``host`` makes that fallback an error (exit 1); ``qpnserve`` never tries the host's.
The hosts' parts are sm_70 kernels: on anything but a V100 with the host installed, ``auto``
falls back. The probes run the part once on tiny inputs (an all-zero one-expert bank for the op,
one expert per format for the converter), so a part that cannot run on this device is found
before any sample is counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qpnserve.errors import UsageError
from qpnserve.geometry import HIDDEN, INTERMEDIATE, TOP_K
from qpnserve.host import NATIVE_OP_NAME, HostInfo
from qpnserve.kernels.reference import Format
from qpnserve.verify import host_library, host_prepare, prepare
from qpnserve.verify.export import ExpertExport, VerifyError

CHOICES = ("auto", "host", "qpnserve")


def device(choice: str) -> Any:
    """The torch device: a visible GPU for "auto" or "cuda", else the CPU."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA GPU is visible")
    if choice != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def _ours(dev: Any, build_dir: Path) -> tuple[Any, str]:
    """qpnserve's prebuilt operator (BuildError, exit 3, when there is no build)."""
    import torch

    from qpnserve.kernels import build

    if dev.type == "cuda":
        result = build.load(build_dir=build_dir)
        archs = ",".join(a.replace(".", "") for a in result.arch_list)
        text = f"CUDA extension (sm_{archs}) on {torch.cuda.get_device_name()}"
    else:
        build.load(cpu_only=True, build_dir=build_dir)
        text = "CPU implementation of the operator (no GPU used)"
    return torch.ops.qpnserve.awq_moe_m1_out, text


def _probe_op(op: Any, banks: prepare.Banks, dev: Any) -> None:
    """One call on ``banks`` (the run's own, still all zero) and zero inputs: a host op that
    does not take this metadata format or shape raises here, before any sample counts."""
    import torch

    out = torch.empty((1, HIDDEN), dtype=torch.float16, device=dev)
    inter = torch.empty((TOP_K, INTERMEDIATE), dtype=torch.float16, device=dev)
    x = torch.zeros((1, HIDDEN), dtype=torch.float16, device=dev)
    ids = torch.zeros((1, TOP_K), dtype=torch.int32, device=dev)
    weights = torch.zeros((1, TOP_K), dtype=torch.float32, device=dev)
    op(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _fmts(formats: list[str]) -> str:
    return " and ".join(formats)


def _refuse(what: str, refused: dict[str, str], usable: Mapping[str, Any], hint: str) -> None:
    """`host` asked for: the first format the host's part cannot serve, and the formats it can."""
    first, reason = next(iter(refused.items()))
    raise VerifyError(
        f"{what.format(first)}: {reason}",
        hint=f"use --meta-format {next(iter(usable))}" if usable else hint,
    )


def operators(
    choice: str,
    host: HostInfo | None,
    dev: Any,
    build_dir: Path,
    banks: dict[Format, prepare.Banks],
) -> tuple[dict[str, Any], str]:
    """(the M1 op per metadata format, which ones in words): a native host's own op for each
    format it takes (ReVolta's reads 3-byte metadata), qpnserve's operator for the others."""
    op, why = (None, "--op qpnserve") if choice == "qpnserve" else host_library.native_m1_op(host)
    chosen: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for fmt, fmt_banks in banks.items():
        if op is None:
            refused[fmt] = why
            continue
        try:
            _probe_op(op, fmt_banks, dev)
            chosen[fmt] = op
        except Exception as exc:  # a compiled op's refusal or failure, in its own words
            refused[fmt] = f"it does not run on {fmt} banks here: {host_library.first_line(exc)}"
    if choice == "host" and refused:
        what = "--op host: the host's own M1 op cannot run the {} samples"
        fallback = "use --op auto, or run on the V100 machine where a native host is installed"
        _refuse(what, refused, chosen, fallback)
    texts = []
    if chosen and host is not None:
        where = "the CPU" if dev.type == "cpu" else "the GPU"
        texts.append(
            f"the host's own op _C::{NATIVE_OP_NAME} ({host_library.label(host)}) on {where}"
            + (f" for {_fmts(list(chosen))}" if refused else "")
        )
    if refused:
        ours, text = _ours(dev, build_dir)
        chosen.update({fmt: ours for fmt in refused})
        reasons = sorted(set(refused.values()))
        scope = f" for {_fmts(list(refused))}" if texts else ""
        if choice != "qpnserve":
            text += f"{scope}; not the host's op ({'; '.join(reasons)})"
        texts.append(text)
    return chosen, "; ".join(texts)


def banks(
    choice: str,
    fault: str | None,
    formats: list[Format],
    rank: int,
    host: HostInfo | None,
    probe: ExpertExport,
    dev: Any,
) -> tuple[dict[str, host_prepare.HostPreparation], str]:
    """(the host's converter per format it has and can run, who prepares, in words); a format
    missing from the dict is prepared by qpnserve. ``probe``: one expert each converter is
    tried on, for ``rank``."""
    preps: dict[str, host_prepare.HostPreparation] = {}
    refused: dict[str, str] = {}
    for fmt in formats:
        if choice == "qpnserve":
            refused[fmt] = "--banks qpnserve"
            continue
        if fault:
            refused[fmt] = "--break breaks qpnserve's own preparation"
            continue
        prep, why = host_prepare.load(host, [fmt])
        if prep is not None:
            try:
                host_prepare.write(prepare.Banks(fmt, dev, num_experts=1), 0, probe, rank, prep)
                preps[fmt] = prep
                continue
            except VerifyError as exc:
                why = exc.message
        refused[fmt] = why
    if choice == "host" and refused:
        what = "--banks host: the host's preparation cannot make the {} banks here"
        fallback = "run on the V100 machine where the host is installed, or use --banks auto"
        _refuse(what, refused, preps, fallback)
    texts = []
    if preps:
        any_prep = next(iter(preps.values()))
        texts.append(any_prep.describe([f for f in formats if f in preps]))
    if refused:
        scope = f"{_fmts(list(refused))} " if preps else ""
        reasons = "; ".join(sorted(set(refused.values())))
        texts.append(f"{scope}{prepare.HOST_PREPARATION_NOTE} ({reasons})")
    return preps, "; ".join(texts)
