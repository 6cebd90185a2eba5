"""The report of scripts/op_trace.py on a synthetic stamp table (no GPU needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def trace():
    sys.path.insert(0, str(SCRIPTS))  # op_trace imports op_timing beside it
    try:
        spec = importlib.util.spec_from_file_location("op_trace", SCRIPTS / "op_trace.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def _stamp(table: torch.Tensor, stamps: int, row: int, times: dict[int, int], ghz: int) -> None:
    base = 1_000_000
    for k, t in times.items():
        table[row, k] = base + t
        table[row, stamps + 1 + k] = ghz * (base + t)  # the SM's cycle counter


def test_report_splits_units_by_sm_and_gives_each_intervals_clock_rate(trace, capsys) -> None:
    table = torch.zeros(trace.SLOTS, trace.COLUMNS, dtype=torch.int64)
    for i in range(trace.UNITS_A):  # units A on SMs 1..100, clocked at 2 GHz
        times = {0: 0, 1: 300, 4: 2000 + i, 2: 2010 + i, 5: 2300 + i, 7: 2600 + i, 3: 3000 + i}
        _stamp(table, trace.STAMPS, i, times, ghz=2)
        table[i, trace.STAMPS] = i + 1
    for j in range(80):  # units B on SMs 1..80, beside 80 of them, at 1 GHz
        times = {0: 700, 1: 3300, 2: 4000, 4: 4300, 5: 4350, 3: 4700}
        _stamp(table, trace.STAMPS, trace.UNITS_A + j, times, ghz=1)
        table[trace.UNITS_A + j, trace.STAMPS] = j + 1
    trace.report(table, "two-kernel")
    out = capsys.readouterr().out
    assert "unit A beside a unit B (80)" in out
    assert "unit A alone on its SM (20)" in out
    assert "unit A (diag) warp 0's first partial in" in out
    assert "unit A SM clock, GHz, by interval: 1->4 2.00, 4->5 2.00, 5->7 2.00, 7->3 2.00" in out
    assert "unit B SM clock, GHz, by interval: 1->2 1.00, 2->4 1.00, 4->5 1.00, 5->3 1.00" in out
    assert "last h stored -> first / last unit B past its wait: 901 / 901 ns" in out


def test_report_of_kernel_a_alone_says_no_unit_b_ran(trace, capsys) -> None:
    table = torch.zeros(trace.SLOTS, trace.COLUMNS, dtype=torch.int64)
    for i in range(trace.UNITS_A):
        _stamp(table, trace.STAMPS, i, {0: 0, 1: 300, 2: 2000, 3: 2500}, ghz=2)
        table[i, trace.STAMPS] = i + 1
    trace.report(table, "two-kernel")
    out = capsys.readouterr().out
    assert "(no unit B ran)" in out
    assert "unit B start" in out and "unit B SM clock" not in out


def test_report_of_the_16_column_kernel_b_reads_its_160_units(trace, capsys) -> None:
    table = torch.zeros(trace.SLOTS, trace.COLUMNS, dtype=torch.int64)
    for i in range(trace.UNITS_A):  # units A on SMs 1..100
        _stamp(table, trace.STAMPS, i, {0: 0, 1: 300, 2: 2000, 3: 2500}, ghz=2)
        table[i, trace.STAMPS] = i + 1
    for j in range(160):  # units B on SMs 1..132 then 1..28; the last one passes its wait last
        times = {0: 700, 1: 2000, 2: 3000 + (j == 159) * 500, 3: 3600 + (j == 159) * 500}
        _stamp(table, trace.STAMPS, trace.UNITS_A + j, times, ghz=1)
        table[trace.UNITS_A + j, trace.STAMPS] = j % 132 + 1
    trace.report(table, "two-kernel")
    out = capsys.readouterr().out
    assert "last h stored -> first / last unit B past its wait: 500 / 1000 ns" in out
    assert "unit B CTAs started before the first h was stored: 160 of 160" in out
    assert "unit A beside a unit B (100)" in out
