"""The V100 projection of the op, for `bench op` on a V100: figures only, a PROJECTION (no V100
has run the op), never a measurement.

The model that makes them (tools/sm70proj: the op's and the host's sm_70 SASS, Volta's
scoreboard, calibrated on the host's measured 20.62 us) is not shipped; it writes
v100_projection.json next to this file (``python -m tools.sm70proj --write-shipped`` in a source
checkout), and a CI test fails when the file no longer matches the tool's output.
"""

from __future__ import annotations

import json
from pathlib import Path

PATH = Path(__file__).with_name("v100_projection.json")


def lines(fmt: str, op_net_us: float) -> list[str]:
    """What bench op prints on sm_70 beside what it measured."""
    try:
        doc = json.loads(PATH.read_text())
        line, (low_us, high_us) = doc["lines"][fmt], doc["op_3byte_range_us"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"V100 projection: not available ({PATH.name} is missing or unreadable)"]
    return [
        f"V100 projection (a model, not a measurement): {line}",
        f"V100 projection of the 3-byte op over its assumptions: {low_us}-{high_us} us/layer; "
        f"measured here: op {op_net_us:.2f} us net (the projection counts one graph node's "
        "launch gap; net times leave out the derive kernel)",
    ]
