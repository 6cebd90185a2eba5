"""The route flag ``VLLM_SM70_AWQ_QWEN38_QPN_M1``: exactly "0" or "1" (contract section 5).

Stdlib only: the plugin calls this in every vLLM process before deciding whether to do anything.
"""

from __future__ import annotations

from qpnserve.config import ROUTE_FLAG, ROUTE_FLAG_VALUES
from qpnserve.errors import DispatchError


def parse_route_flag(raw: str | None) -> bool:
    """``None`` (unset) or "0" -> False; "1" -> True; anything else raises DispatchError.

    No trimming and no synonyms: " 1", "true", "" and "2" are errors, because a typo that
    silently meant "off" would look exactly like a route that gives nothing.
    """
    if raw is None:
        return False
    if raw in ROUTE_FLAG_VALUES:
        return raw == ROUTE_FLAG_VALUES[1]
    raise DispatchError(
        f"{ROUTE_FLAG.name}={raw!r} is not an accepted value; accepted values are exactly "
        f"'0' (route off) and '1' (route on, fail closed)",
        hint=f"export {ROUTE_FLAG.name}=1 (or 0, or unset it) and restart the server",
    )
