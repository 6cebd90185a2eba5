"""The sm_70 compile gate (NVRTC + ptxas 12.8 from PyPI): compiles, spill-free, 128-bit loads."""

from __future__ import annotations

from tools import sm70_gate


def test_sm70_build_compiles_spill_free_with_128_bit_loads() -> None:
    report = sm70_gate.run_gate("70")
    print(sm70_gate.render(report))  # the register/smem report, visible with pytest -s / -rA
    assert report.ok, report.problems
    on_sm70 = [k for k in report.kernels if k.runs_on_sm70]
    # What runs on a V100 is the V100 design (one cooperative launch), in both formats.
    assert sorted(k.name for k in on_sm70) == [
        "v100 design 3-byte m8n8k4",
        "v100 design 4-byte m8n8k4",
    ]
    for kernel in on_sm70:
        assert kernel.registers > 0
        assert kernel.spill_store_bytes == 0 and kernel.spill_load_bytes == 0
        assert kernel.stack_bytes == 0
    assert report.ptx_loads_v4 > 0


def test_ptxas_report_parser_reads_spills_and_registers() -> None:
    text = (
        "ptxas info    : Compiling entry function '_Z1kv' for 'sm_70'\n"
        "ptxas info    : Function properties for _Z1kv\n"
        "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 96 registers, 2048 bytes smem, 356 bytes cmem[0]\n"
    )
    report = sm70_gate.KernelReport(name="k", mangled="_Z1kv", runs_on_sm70=True)
    sm70_gate.parse_ptxas(text, {"_Z1kv": report})
    assert (report.registers, report.smem_bytes) == (96, 2048)
    assert (report.stack_bytes, report.spill_store_bytes, report.spill_load_bytes) == (16, 8, 4)
    assert not report.clean
