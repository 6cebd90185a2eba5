"""The projection's last lines (#31 item 6), the host builds they compare, and the figures the
wheel ships for `bench op` on a V100 (#31 item 7)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from qpnserve.benchop import v100_projection
from qpnserve.benchop.report import render_table
from qpnserve.benchop.runner import BenchConfig, floor_variants, run_bench
from tests.bench_op.conftest import NUM_EXPERTS, make_ops
from tools.sm70proj import cli, model, shipped, tables

LINE = re.compile(
    r"projected V100 us/layer \((3|4)-byte, scoreboard-aware\): op \d+\.\d, floor \d+\.\d, "
    r"host kernel \d+\.\d \((measured 20\.62|not measured)\), ratio Y/X = \d+\.\d\d$"
)


def test_the_3byte_line_compares_the_host_launch_measured_at_20_62() -> None:
    f = {"op_us": 16.04, "floor_us": 13.04, "host_us": 19.52, "host_measured_us": 20.616}
    assert shipped.line("3-byte", f) == (
        "projected V100 us/layer (3-byte, scoreboard-aware): op 16.0, floor 13.0, "
        "host kernel 19.5 (measured 20.62), ratio Y/X = 1.22"
    )


def test_the_4byte_line_says_the_host_was_never_measured() -> None:
    f = {"op_us": 16.5, "floor_us": 13.49, "host_us": 19.04, "host_measured_us": None}
    assert shipped.line("4-byte", f) == (
        "projected V100 us/layer (4-byte, scoreboard-aware): op 16.5, floor 13.5, "
        "host kernel 19.0 (not measured), ratio Y/X = 1.15"
    )


def test_the_last_lines_are_4byte_then_20_62_over_x_then_3byte() -> None:
    def op(us: float, floor: float) -> dict[str, object]:
        return {"us": us, "floor": model.NodeTerms("f", 0, 1, 0, 0, 0, 0, 0, "bw", total_us=floor)}

    p = {
        "op-3byte": op(16.04, 13.04),
        "op-4byte": op(16.5, 13.49),
        "host-3byte": {"us": 19.52, "measured_us": 20.616},
        "host-4byte": {"us": 19.04, "measured_us": None},
    }
    last = cli.summary(p)
    assert [bool(LINE.match(x)) for x in last] == [True, False, True]
    assert last[0].startswith("projected V100 us/layer (4-byte,") and "(not measured)" in last[0]
    assert last[1] == "20.62/X = 1.29"  # 20.62 / 16.04
    assert last[2].startswith("projected V100 us/layer (3-byte,") and "(measured 20.62)" in last[2]


def test_host_builds_carry_the_origins_labels() -> None:
    # docs/design/sm70_awq_qpn_m1.md at the host's a223f04: 21.5280 us scalar 3-byte W13/W2,
    # 20.6160 us the cooperative build (W13 cooperative reader, W2 scalar); launch<1, 0>.
    compact, scalar, four = (tables.HOST_BUILDS[k] for k in ("3byte", "3byte-scalar", "4byte"))
    assert (compact.w13_template, compact.w2_template, compact.measured_us) == (1, 0, 20.616)
    assert (scalar.w2_template, scalar.measured_us) == (0, 21.528)
    assert (four.w13_template, four.w2_template, four.measured_us) == (2, 2, None)


def test_the_shipped_figures_have_the_last_lines_format() -> None:
    doc = json.loads(v100_projection.PATH.read_text())
    assert LINE.match(doc["lines"]["3byte"]) and "(measured 20.62)" in doc["lines"]["3byte"]
    assert LINE.match(doc["lines"]["4byte"]) and "(not measured)" in doc["lines"]["4byte"]
    assert doc["last_lines"][0] == doc["lines"]["4byte"]
    assert doc["last_lines"][2] == doc["lines"]["3byte"]
    low, high = doc["op_3byte_range_us"]
    assert low <= doc["formats"]["3byte"]["op_us"] <= high


def test_bench_op_prints_the_projection_beside_the_measurement_on_sm70_only() -> None:
    config = BenchConfig(
        fmt="4byte", layers=1, iters=3, rounds=1, warmup=0, num_experts=NUM_EXPERTS,
        floor_variants=floor_variants((0, 1)),
    )  # fmt: skip
    report = run_bench(config, make_ops(), torch.device("cpu"))
    assert "V100 projection" not in render_table(report)  # compute capability 0.0
    v100 = report.model_copy(
        update={"device": report.device.model_copy(update={"compute_capability": "7.0"})}
    )
    table = render_table(v100)
    doc = json.loads(v100_projection.PATH.read_text())
    assert f"V100 projection (a model, not a measurement): {doc['lines']['4byte']}" in table
    assert f"measured here: op {report.op.net_us:.2f} us net" in table


def test_a_missing_shipped_file_says_so(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(v100_projection, "PATH", tmp_path / "v100_projection.json")
    assert v100_projection.lines("3byte", 5.0) == [
        "V100 projection: not available (v100_projection.json is missing or unreadable)"
    ]


@pytest.mark.slow
def test_the_shipped_figures_match_the_tools_current_output(tmp_path: Path) -> None:
    """Fetches the ReVolta 0.1.4 and triton 3.3.1 wheels (cached per user), compiles ours."""
    if os.environ.get("QPNSERVE_NO_NETWORK") == "1":
        pytest.skip("QPNSERVE_NO_NETWORK=1: the wheels cannot be fetched")
    loaded = cli.load(tmp_path)
    a = cli.Assumptions()
    gap = cli.fitted_gap(loaded, a)
    result = cli.project(loaded, a, gap)
    low, high = cli.op_range(loaded)
    doc = shipped.document(result, cli.summary(result), gap, a.latency_us)
    doc["op_3byte_range_us"] = [round(low, 1), round(high, 1)]
    hint = "regenerate it: python -m tools.sm70proj --write-shipped"
    assert json.loads(v100_projection.PATH.read_text()) == doc, hint
