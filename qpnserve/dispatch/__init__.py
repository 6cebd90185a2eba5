"""The dispatch patch: route exactly the one-token decode call of the host's SM70 AWQ MoE method
to the qpnserve operator, fail closed under ``VLLM_SM70_AWQ_QWEN38_QPN_M1=1``, and leave a route
report per tensor-parallel rank.

Modules (read in this order):
    flag.py      the route flag's accepted values (stdlib only; the plugin imports just this)
    manifest.py  patches/awq_m1_dispatch.toml: target, validated host builds, drift check
    contract.py  pure checks: the per-layer init contract and the per-call admission
    recorder.py  the per-rank route report, rewritten atomically as layers initialise
    graphs.py    is a call being captured into a CUDA graph; vLLM's planned capture sizes
    wrap.py      the wrappers around the host class, with an idempotency marker
    runtime.py   activate(): host detection, manifest check, extension load, wrapping
    observe.py   the native host's observer: watches only, every failure a warning

Importing this package stays trivial (no torch, no vllm); everything heavy is imported inside
functions, after the flag said "1".
"""

from __future__ import annotations

from qpnserve.dispatch.flag import parse_route_flag

__all__ = ["parse_route_flag"]
