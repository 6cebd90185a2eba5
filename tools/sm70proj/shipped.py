"""The projection's summary lines, and the figures the wheel ships for `bench op` on a V100.

tools/ is not shipped, so `qpnserve bench op` cannot run the model; it prints what this module
wrote into qpnserve/benchop/v100_projection.json (``python -m tools.sm70proj --write-shipped``).
A CI test re-runs the tool and fails when the file no longer matches its output.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import tables

SHIPPED = Path(__file__).resolve().parents[2] / "qpnserve" / "benchop" / "v100_projection.json"
HOST_MEASURED_3BYTE_US = round(tables.HOST_BUILDS["3byte"].measured_us or 0.0, 2)  # 20.62
HOST_FOR_FORMAT = {"3byte": "3byte", "4byte": "4byte"}  # the host build each line compares
TAGS = {"3byte": "3-byte", "4byte": "4-byte"}


def figures(p: dict[str, dict[str, object]]) -> dict[str, dict[str, float | None]]:
    """Per format: the op, its read floor and the host's launch, all projected by one model."""
    out: dict[str, dict[str, float | None]] = {}
    for fmt, build in HOST_FOR_FORMAT.items():
        op, host = p[f"op-{fmt}"], p[f"host-{build}"]
        measured = host["measured_us"]
        out[fmt] = {
            "op_us": float(op["us"]),  # type: ignore[arg-type]
            "floor_us": float(op["floor"].total_us),  # type: ignore[attr-defined]
            "host_us": float(host["us"]),  # type: ignore[arg-type]
            "host_measured_us": float(measured) if isinstance(measured, float) else None,
        }
    return out


def line(tag: str, f: dict[str, float | None]) -> str:
    """`projected V100 us/layer (3-byte, scoreboard-aware): op X, floor F, host kernel Y
    (measured 20.62), ratio Y/X = Z`; "(not measured)" where the host was never measured."""
    op, floor, host = float(f["op_us"] or 0), float(f["floor_us"] or 0), float(f["host_us"] or 0)
    measured = f["host_measured_us"]
    said = f"measured {measured:.2f}" if measured else "not measured"
    return (
        f"projected V100 us/layer ({tag}, scoreboard-aware): op {op:.1f}, floor {floor:.1f}, "
        f"host kernel {host:.1f} ({said}), ratio Y/X = {host / op:.2f}"
    )


def document(
    p: dict[str, dict[str, object]], last_lines: list[str], gap_us: float, latency_us: float
) -> dict[str, object]:
    return {
        "what": "a V100 PROJECTION of the op (no V100 has run it), not a measurement",
        "reproduce": "python -m tools.sm70proj  (a source checkout; CPU only)",
        "launch_gap_us": round(gap_us, 3),
        "dram_latency_us": latency_us,
        "formats": {
            fmt: {k: None if v is None else round(v, 3) for k, v in f.items()}
            for fmt, f in figures(p).items()
        },
        "lines": {fmt: line(TAGS[fmt], f) for fmt, f in figures(p).items()},
        "last_lines": last_lines,
    }


def write(doc: dict[str, object], path: Path = SHIPPED) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")
