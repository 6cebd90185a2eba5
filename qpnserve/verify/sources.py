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


def _probe_op(op: Any, dev: Any) -> None:
    import torch

    banks = prepare.Banks("4byte", dev, num_experts=1)
    out = torch.empty((1, HIDDEN), dtype=torch.float16, device=dev)
    inter = torch.empty((TOP_K, INTERMEDIATE), dtype=torch.float16, device=dev)
    x = torch.zeros((1, HIDDEN), dtype=torch.float16, device=dev)
    ids = torch.zeros((1, TOP_K), dtype=torch.int32, device=dev)
    weights = torch.zeros((1, TOP_K), dtype=torch.float32, device=dev)
    op(out, inter, x, banks.w13, banks.s13, banks.w2, banks.s2, ids, weights)
    if dev.type == "cuda":
        torch.cuda.synchronize()


def operator(choice: str, host: HostInfo | None, dev: Any, build_dir: Path) -> tuple[Any, str]:
    """(the M1 op to run, which one it is in words)."""
    op, why = (None, "--op qpnserve") if choice == "qpnserve" else host_library.native_m1_op(host)
    if op is not None and host is not None:
        try:
            _probe_op(op, dev)
            where = "the CPU" if dev.type == "cpu" else "the GPU"
            return (
                op,
                f"the host's own op _C::{NATIVE_OP_NAME} ({host_library.label(host)}) on {where}",
            )
        except Exception as exc:  # a compiled op's failure on this device, in its own words
            op, why = None, f"its op does not run here ({host_library.first_line(exc)})"
    if choice == "host":
        raise VerifyError(
            f"--op host: the host's own M1 op cannot run here: {why}",
            hint="run on the V100 machine where a native host is installed, or use --op auto",
        )
    ours, text = _ours(dev, build_dir)
    return ours, text if choice == "qpnserve" else f"{text}; not the host's op ({why})"


def banks(
    choice: str,
    fault: str | None,
    formats: list[Format],
    rank: int,
    host: HostInfo | None,
    probe: ExpertExport,
    dev: Any,
) -> tuple[host_prepare.HostPreparation | None, str]:
    """(the host's converters, or None for qpnserve's preparation; who prepares, in words).
    ``probe``: one expert the converter is tried on, for ``rank``, in every format."""
    if choice == "qpnserve":
        prep, why = None, "--banks qpnserve"
    elif fault:
        prep, why = None, "--break breaks qpnserve's own preparation"
    else:
        prep, why = host_prepare.load(host, formats)
    if prep is not None:
        try:
            for fmt in formats:
                one = prepare.Banks(fmt, dev, num_experts=1)
                host_prepare.write(one, 0, probe, rank, prep)
        except VerifyError as exc:
            prep, why = None, exc.message
    if prep is None and choice == "host":
        raise VerifyError(
            f"--banks host: the host's preparation cannot run here: {why}",
            hint="run on the V100 machine where the host is installed, or use --banks auto",
        )
    if prep is not None:
        return prep, prep.describe(formats)
    return None, f"{prepare.HOST_PREPARATION_NOTE} ({why})"
