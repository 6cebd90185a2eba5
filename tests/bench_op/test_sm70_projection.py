"""Pure parts of scripts/sm70_projection.py: SASS classification, loads in flight, occupancy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sm70_projection.py"


@pytest.fixture(scope="module")
def proj():
    spec = importlib.util.spec_from_file_location("sm70_projection", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_projection_classifies_predicated_sass(proj) -> None:
    assert proj.opcode("@!P0 LDG.E.128.SYS R4, [R2]") == "LDG.E.128.SYS"
    assert proj.kind_of("@!P0 LDG.E.128.SYS R4, [R2]") == "load_global"
    assert proj.kind_of("HMMA.884.F32.F32.STEP0 R8, R20.ROW, R22.COL, R8") == "hmma"
    assert proj.kind_of("LOP3.LUT R5, R4, 0xf000f, RZ, 0xc0, !PT") == "lop3"
    assert proj.kind_of("F2F.F16.F32 R3, R2") == "conversion"


def test_projection_counts_loads_outstanding_until_first_use(proj) -> None:
    sass = [
        "LDG.E.128.SYS R4, [R2]",
        "LDG.E.128.SYS R8, [R2+0x10]",
        "LDG.E.SYS R12, [R2+0x20]",
        "IADD3 R1, R1, 0x1, RZ",  # reads no loaded register
        "LOP3.LUT R20, R5, 0xf, RZ, 0xc0, !PT",  # first use of the first load
        "LDG.E.128.SYS R24, [R2+0x30]",
    ]
    assert proj.max_loads_in_flight(sass) == (3, 36)


def test_projection_v100_occupancy_is_register_limited(proj) -> None:
    # 92 registers x 512 threads: 96 x 32 = 3072 registers per warp, 21 warps fit, 16 per CTA.
    assert proj.occupancy(92, 512, 13312) == (1, 16)
    # 40 registers x 256 threads: 51 warps by registers -> 6 CTAs of 8 warps.
    assert proj.occupancy(40, 256, 0) == (6, 48)


def test_floor_device_code_compiles_for_sm70_without_spills(proj, tmp_path) -> None:
    from qpnserve.kernels import sm70_gate

    variants = [(n, p) for n in (2, 16) for p in ("false", "true")]
    exprs = [f"qpnserve_floor::read_floor_m1_kernel<{n}, {p}>" for n, p in variants]
    exprs.append("qpnserve_floor::derive_input_m1_kernel")
    ptx, lowered = proj.nvrtc_ptx(proj.ROOT / "csrc" / "bench_floor.cu", exprs, [])
    assert "ld.global.cs.v4.u32" in ptx
    assert "griddepcontrol" not in ptx  # PDL is compiled out below sm_90
    _, log = proj.ptxas(ptx, tmp_path, "floor")
    reports = {m: sm70_gate.KernelReport(e, m, True) for e, m in lowered.items()}
    sm70_gate.parse_ptxas(log, reports)
    for report in reports.values():
        assert report.registers > 0 and report.clean and report.stack_bytes == 0, report
