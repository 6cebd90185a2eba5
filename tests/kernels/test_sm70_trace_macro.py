"""The traced build adds only its stamps: without QPN_TRACE the trace macros compile to nothing.

`bench op --trace` runs a copy of the operator compiled with QPN_TRACE (csrc/bench_trace.cu).
Its figures stand for the shipped kernel only if the shipped build is the source without the
trace: this compiles csrc/ for sm_70 as shipped and a copy with every QPN_TRACE_STAMP line
deleted, and requires the same SASS, instruction for instruction, control bits included. It
also checks the traced build itself compiles for sm_70 (the stamps cost registers, not spills).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qpnserve.resources import resource_dir
from tests.kernels.test_sm70_scoreboard import KERNELS, sm70_listing

pytestmark = pytest.mark.slow


def _without_stamps(tmp: Path) -> Path:
    copy = tmp / "csrc"
    shutil.copytree(resource_dir("csrc"), copy)
    stripped = 0
    for path in copy.iterdir():
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if "QPN_TRACE_STAMP(" not in line]
        stripped += len(lines) - len(kept)
        path.write_text("".join(kept))
    assert stripped >= 6, "the kernel's stamp lines were not found: nothing was compared"
    return copy


def test_untraced_sass_equals_the_source_without_trace_stamps(tmp_path: Path) -> None:
    shipped = sm70_listing(tmp_path / "a")
    bare = sm70_listing(tmp_path / "b", csrc=_without_stamps(tmp_path))
    for expr in KERNELS.values():
        got = [(x.text, x.hi) for x in shipped[expr]]
        want = [(x.text, x.hi) for x in bare[expr]]
        assert len(got) > 1000, f"{expr}: {len(got)} instructions, not the V100 design"
        assert got == want, f"{expr}: the shipped SASS differs from the source without stamps"


def test_traced_build_differs_and_stores_the_timers(tmp_path: Path) -> None:
    # The comparison above can fail: the traced build's SASS is not the shipped one.
    traced = sm70_listing(tmp_path, defines=("QPN_TRACE=1",))
    for instrs in traced.values():
        reads = [x for x in instrs if "SR_GLOBALTIMER" in x.text or "CS2R" in x.opcode]
        assert len([x for x in instrs if "SR_GLOBALTIMER" in x.text]) >= 6, reads
