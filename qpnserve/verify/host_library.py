"""The installed host's compiled ``_C`` ops that `verify --offline` can drive: its bank
converters (verify/host_prepare.py) and, on a native host, its own M1 op.

The library is loaded with torch.ops.load_library from the host's package directory (its
``_C*.so``); the host's ``vllm`` package is never imported. In a process where vLLM already
loaded it, the ops are found without loading anything. Every lookup answers (op, "") or
(None, why not) in one line, so the caller can say what it used instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qpnserve.host import NATIVE_OP_NAME, HostInfo

Op = Callable[..., Any]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def label(host: HostInfo) -> str:
    return f"{host.dist_name or 'vllm'} {host.version or '?'}"


def find_ops(host: HostInfo | None, names: list[str]) -> tuple[dict[str, Op] | None, str]:
    """``torch.ops._C.<name>`` for every name, loading the host's library first when one is
    missing; (None, why) when there is no such host, the library does not load, or a name is
    not in it."""
    if host is None or not host.found or host.kind == "none":
        return None, "no 1Cat-vLLM or ReVolta host is installed"
    import torch

    def missing() -> list[str]:
        return [name for name in names if not hasattr(torch.ops._C, name)]

    failed = ""
    if missing():
        package = host.package_dir
        libraries = sorted(Path(package).glob("_C*.so")) if package is not None else []
        if not libraries:
            return None, f"{label(host)} has no _C library in its package directory"
        for library in libraries:  # until every name resolves; a failure is kept for the reason
            try:
                torch.ops.load_library(str(library))
            except (OSError, RuntimeError) as exc:
                why = f"{label(host)}'s {library.name} does not load here ({first_line(exc)})"
                failed = failed or why
            if not missing():
                break
    if missing():
        return None, failed or f"{label(host)}'s library has no {', '.join(missing())}"
    return {name: getattr(torch.ops._C, name) for name in names}, ""


def native_m1_op(host: HostInfo | None) -> tuple[Op | None, str]:
    """A native host's own M1 op, ``_C::awq_moe_qpn_m1_sm70_out``; (None, why) elsewhere."""
    if host is not None and host.kind == "patched":
        return None, f"{label(host)} is a patched host: its route is qpnserve's operator"
    ops, why = find_ops(host, [NATIVE_OP_NAME])
    return (ops[NATIVE_OP_NAME], "") if ops else (None, why)
