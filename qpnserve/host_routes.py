"""What the route flag means on each kind of host, and the host's other routes on the same
MoE layers: one wording for `check`, `status` and `up --dry-run`. Pure and light (it imports
only qpnserve.config), so the CLI and the launch plan share it without loading more.

On a native host (ReVolta 0.1.4, ``vllm/envs.py``) ``VLLM_SM70_AWQ_QWEN38_QPN_M1`` defaults to
on when unset, and an unsupported layer then falls back silently; an explicit ``1`` fails closed.
On a patched host unset means off (the plugin does nothing). `qpnserve up` always writes the
flag, so the servers it starts never depend on the default.

ReVolta also has a grouped decode route that takes the same MoE layers for 2..N rows
(``VLLM_SM70_AWQ_QWEN38_GROUPED_QPN``, off by its envs.py default) which its V100 profile
(``vllm/revolta_profile.py``, all devices SM70, FP16, TP 4, AWQ, a checkpoint with
sparse-attention selector metadata: qpnserve.host_profile) turns on with the values below;
an explicit environment value wins over the profile. An A/B of the single-token route runs with
whatever that route is set to, so a reader needs to see it.
"""

from __future__ import annotations

from collections.abc import Mapping

from qpnserve.config import ROUTE_FLAG
from qpnserve.dispatch.flag import parse_route_flag
from qpnserve.errors import DispatchError

ROUTE_FLAG_NAME = ROUTE_FLAG.name
GROUPED_FLAG = "VLLM_SM70_AWQ_QWEN38_GROUPED_QPN"
# (variable, envs.py default, value ReVolta's V100 TP4 AWQ profile sets, what it is)
GROUPED_ROUTE_VARS = (
    (GROUPED_FLAG, "0", "1", "on"),
    ("VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_MAX_TOKENS", "20", "40", "most rows"),
    ("VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_SPLIT", "16", "8", "W13 split-K warps"),
    ("VLLM_SM70_AWQ_QWEN38_GROUPED_QPN_PACK_ROWS", "0", "24", "rows per expert pack"),
)
GROUPED_ROUTE_NAMES = tuple(var for var, *_ in GROUPED_ROUTE_VARS)


def route_default_on(host_kind: str | None) -> bool:
    return host_kind == "native"


def route_flag_meaning(value: str | None, host_kind: str | None) -> str:
    """ "on (VLLM_SM70_AWQ_QWEN38_QPN_M1 unset; the native host's default, ...)", "off (...=0)"
    and so on: the route's state for a flag value on a kind of host, with why."""
    if value is None:
        if route_default_on(host_kind):
            return (
                f"on ({ROUTE_FLAG_NAME} unset; the native host's default, an unsupported layer "
                "falls back silently)"
            )
        return f"off ({ROUTE_FLAG_NAME} unset)"
    try:
        on = parse_route_flag(value)  # the plugin's own validator
    except DispatchError:
        return f"refused ({ROUTE_FLAG_NAME}={value!r}; only '0' and '1' are accepted)"
    if not on:
        return f"off ({ROUTE_FLAG_NAME}=0)"
    if host_kind == "native":
        return f"on ({ROUTE_FLAG_NAME}=1; explicit, the host fails closed on a layer)"
    return f"on ({ROUTE_FLAG_NAME}=1)"


def grouped_route_text(env: Mapping[str, str | None], host_kind: str | None) -> str | None:
    """One line on the native host's grouped decode route, or None on other hosts."""
    if host_kind != "native":
        return None
    flag = env.get(GROUPED_FLAG)
    if flag is None:
        return (
            f"{GROUPED_FLAG} unset: the host's grouped decode route (2..40 rows, same MoE layers) "
            "is off by default, on where ReVolta's V100 TP4 AWQ profile applies"
        )
    settings = ", ".join(
        f"{what} {env[var]}"
        for var, _, _, what in GROUPED_ROUTE_VARS[1:]
        if env.get(var) is not None
    )
    state = "off" if flag == "0" else "on"
    detail = f" ({settings})" if settings and state == "on" else ""
    return (
        f"{GROUPED_FLAG}={flag}: the host's grouped decode route (2..N rows, same MoE layers) "
        f"is {state}{detail}"
    )
