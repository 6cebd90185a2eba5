"""`verify` without --offline: the route on the server's real MoE inputs, against the reference.

The comparison half (the server half is live_run.py): every capture the ranks' plugins wrote
(qpnserve/dispatch/capture.py) becomes a sample, compared with the FP64 reference decoded from
the checkpoint's export for that rank, per arm (``route``; ``legacy``, the host's own route, on
a patched host); a (layer, prefix, rank, arm) that was expected but never captured is refused
("not captured"), never passed. On a native host the captures also say whether the server's own
output was the route's (``served``), counted into ``report.served``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qpnserve.geometry import HIDDEN, TOP_K
from qpnserve.verify.export import Checkpoint, VerifyError
from qpnserve.verify.offline import judge
from qpnserve.verify.reference import reference
from qpnserve.verify.report import SampleResult, VerifyReport
from qpnserve.verify.samples import Sample

_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Captured:
    layer: int
    prefix: int
    rank: int
    arm: str
    meta_format: str
    x: np.ndarray  # (2560,) float16
    ids: np.ndarray  # (10,) int32
    weights: np.ndarray  # (10,) float32
    out: np.ndarray  # (2560,) float64 of fp16 values
    intermediate: np.ndarray  # (10, 160) float64 of fp16 values
    # Native host: "identical" when the output the server served was the route's bit for bit,
    # "differs" when not; "" on a patched host (there the served output is the capture).
    served: str = ""


def read_captures(directory: Path) -> list[Captured]:
    found = []
    for path in sorted(directory.glob("rank*/*.npz")):
        with np.load(path) as d:
            match = _LAYER_INDEX.search(f".{d['layer']}.")
            if match is None:
                raise VerifyError(f"{path.name}: layer {d['layer']} has no layer index")
            found.append(
                Captured(
                    layer=int(match.group(1)),
                    prefix=int(d["prefix"]),
                    rank=int(d["rank"]),
                    arm=str(d["arm"]),
                    meta_format=str(d["meta_format"]),
                    x=d["x"].reshape(HIDDEN).astype(np.float16),
                    ids=d["ids"].reshape(TOP_K).astype(np.int32),
                    weights=d["weights"].reshape(TOP_K).astype(np.float32),
                    out=d["out"].reshape(HIDDEN).astype(np.float64),
                    intermediate=d["intermediate"].astype(np.float64),
                    served=str(d["served"]) if "served" in d.files else "",
                )
            )
    return found


def compare_captures(directory: Path, report: VerifyReport, arms: list[str]) -> VerifyReport:
    """Fill ``report.samples``: one per expected (layer, prefix, rank, arm), captured or not."""
    ck = Checkpoint(Path(report.model))
    captures = read_captures(directory)
    by_key = {(c.layer, c.prefix, c.rank, c.arm): c for c in captures}
    checked = [c for c in captures if c.served and c.layer in report.layers]
    if checked:
        identical = sum(c.served == "identical" for c in checked)
        report.served = {"checked": len(checked), "identical": identical}
    for layer in report.layers:
        mine = [c for c in captures if c.layer == layer and c.prefix in report.prefixes]
        experts = {int(e): ck.expert(layer, int(e)) for c in mine for e in c.ids}
        for prefix in report.prefixes:
            for rank in report.ranks:
                for arm in arms:
                    c = by_key.get((layer, prefix, rank, arm))
                    if c is None:
                        report.samples.append(
                            SampleResult(layer, prefix, rank, arm, "-", "refused",
                                         reason="not captured: no admitted one-token call")
                        )  # fmt: skip
                        continue
                    sample = Sample(layer, prefix, c.x, c.ids, c.weights)
                    (ref,) = reference(sample, experts, [rank])
                    if ref.refused:
                        report.samples.append(
                            SampleResult(layer, prefix, rank, arm, c.meta_format, "refused",
                                         reason=ref.refused)
                        )  # fmt: skip
                        continue
                    report.samples.append(
                        judge(layer, prefix, rank, arm, c.meta_format, c.out, c.intermediate, ref)
                    )
    return report
