"""The host's own M=1 op, timed beside ours on the same banks and inputs (a native host).

A native host (ReVolta: contract section 1) ships ``torch.ops._C.awq_moe_qpn_m1_sm70_out``
with our argument order (contract section 4). `bench op` checks its output against the same
FP64 reference first; only a right answer is timed, and a wrong or failing host op is a note,
never a stop (our op's figures stand on their own). Anywhere else the report says it is absent.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from qpnserve.benchop.checks import record_chain, verify_routes
from qpnserve.benchop.contenders import Derive, LayerState, op_contender
from qpnserve.errors import BenchError, CanaryError

HOST_OP = "awq_moe_qpn_m1_sm70_out"
WHAT = f"torch.ops._C.{HOST_OP} (the host's own M=1 op, same banks and inputs)"


def lookup(namespace: str = "_C") -> Callable[..., None] | None:
    """torch.ops.<namespace>.awq_moe_qpn_m1_sm70_out if registered, else None."""
    ns = getattr(torch.ops, namespace)
    return getattr(ns, HOST_OP) if hasattr(ns, HOST_OP) else None


def find_host_op() -> tuple[Callable[..., None] | None, str]:
    """(the host op or None, one line saying which). Loads vllm._C only where vllm is installed."""
    if importlib.util.find_spec("vllm") is None:
        return None, f"host op absent: no vllm here, so no torch.ops._C.{HOST_OP}"
    try:
        importlib.import_module("vllm._C")
    except Exception as exc:  # a broken host build is a note, not a stop
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        return None, f"host op absent: vllm._C did not load ({first})"
    op = lookup("_C")
    if op is None:
        return None, f"host op absent: this vllm has no torch.ops._C.{HOST_OP} (not a native host)"
    return op, f"host op: torch.ops._C.{HOST_OP} found, checked and timed beside ours"


@dataclass
class HostOpRun:
    """The host op's checked chain over the benchmark's layers, ready to record and time."""

    states: list[LayerState]
    record: Callable[[], None]
    verified: str


def prepare(
    op: Callable[..., None], states: Sequence[LayerState], derive: Derive
) -> tuple[HostOpRun | None, str | None]:
    """(the run, None) when the host op meets the FP64 bounds on every layer, else (None, why)."""
    run = op_contender(op)
    try:
        verified = verify_routes("host op", states, derive, run, with_h=True)
    except CanaryError as exc:
        return None, f"host op not timed: {str(exc).split('; no time')[0]}"
    except (RuntimeError, BenchError) as exc:  # e.g. its sm_70-only build on another GPU
        return None, f"host op not timed: it failed ({(str(exc).splitlines() or [''])[0][:160]})"
    return HostOpRun(list(states), record_chain(states, derive, run), verified), None
