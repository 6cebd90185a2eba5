"""The machine probes on stand-ins: a fake pynvml, a fake torch tree with a crafted CUDA fatbin,
nvcc version text. A missing piece is a fact, never an exception."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from qpnserve.preflight import probes
from qpnserve.preflight.fatbin import FATBIN_MAGIC, fatbin_archs


def fatbin_entry(kind: int, arch: int, payload: bytes = b"\x00" * 24) -> bytes:
    header = struct.pack("<HHIQIIHHI", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch)
    return header.ljust(64, b"\x00") + payload


def fatbin_container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with_section(name: bytes, payload: bytes) -> bytes:
    """A minimal ELF64 little-endian file: header, one named section, .shstrtab, 3 headers."""
    strtab = b"\x00" + name + b"\x00.shstrtab\x00"
    payload_off = 64
    str_off = payload_off + len(payload)
    sh_off = (str_off + len(strtab) + 7) // 8 * 8
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\x00" * 8
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    null = b"\x00" * 64
    data = struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, payload_off, len(payload), 0, 0, 8, 0)
    names = struct.pack("<IIQQQQIIQQ", 2 + len(name), 3, 0, 0, str_off, len(strtab), 0, 0, 1, 0)
    body = header + payload + strtab
    return body.ljust(sh_off, b"\x00") + null + data + names


def test_fatbin_archs_lists_cubins_and_ptx_across_padded_containers(tmp_path: Path) -> None:
    fatbin = (
        fatbin_container(fatbin_entry(2, 70), fatbin_entry(2, 80))
        + b"\x00" * 8  # alignment padding between containers
        + fatbin_container(fatbin_entry(2, 90), fatbin_entry(1, 90))
    )
    lib = tmp_path / "libx.so"
    lib.write_bytes(elf_with_section(b".nv_fatbin", fatbin))
    assert fatbin_archs(lib) == ["sm_70", "sm_80", "sm_90", "compute_90"]


def test_fatbin_archs_is_none_without_fatbin_section(tmp_path: Path) -> None:
    lib = tmp_path / "libx.so"
    lib.write_bytes(elf_with_section(b".text", b"\x90" * 32))
    assert fatbin_archs(lib) is None
    (tmp_path / "notelf.so").write_bytes(b"not an elf at all")
    assert fatbin_archs(tmp_path / "notelf.so") is None


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fatbin_archs_reads_library_built_by_nvcc(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k(float* x) { x[0] = 1.0f; }\n")
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(tmp_path / "libk.so")]
    cmd += ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    built = subprocess.run([*cmd, str(tmp_path / "k.cu")], capture_output=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"nvcc could not build: {built.stderr[-200:]!r}")
    assert fatbin_archs(tmp_path / "libk.so") == ["sm_80", "sm_90"]


def fake_torch(site: Path, cuda: str | None, fatbin: bytes | None) -> None:
    torch_dir = site / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("raise RuntimeError('a test imported torch')\n")
    cuda_text = repr(cuda)
    (torch_dir / "version.py").write_text(
        "from typing import Optional\n"
        "__version__ = '2.10.0+cu128'\n"
        f"cuda: Optional[str] = {cuda_text}\n"
    )
    if fatbin is not None:
        (torch_dir / "lib" / "libtorch_cuda.so").write_bytes(
            elf_with_section(b".nv_fatbin", fatbin)
        )


def test_probe_torch_reads_version_cuda_and_archs_without_import(tmp_path: Path) -> None:
    fake_torch(tmp_path, "12.8", fatbin_container(fatbin_entry(2, 70), fatbin_entry(2, 90)))
    facts = probes.probe_torch([str(tmp_path)])
    assert (facts.version, facts.cuda_version) == ("2.10.0+cu128", "12.8")
    assert facts.arch_list == ["sm_70", "sm_90"]
    assert facts.arch_source == "fatbin:libtorch_cuda.so"


def test_probe_torch_prefers_compiled_arch_flags_string(tmp_path: Path) -> None:
    fake_torch(tmp_path, "12.8", fatbin_container(fatbin_entry(2, 89)))
    lib = tmp_path / "torch" / "lib" / "libtorch_python.so"
    # As in a real wheel: other strings around, one NUL-terminated arch flags string.
    lib.write_bytes(b"\x7fELF junk sm_75\x00_use_cxx11_abi\x00sm_70 sm_75 sm_80 sm_90\x00inv\x00")
    facts = probes.probe_torch([str(tmp_path)])
    assert facts.arch_list == ["sm_70", "sm_75", "sm_80", "sm_90"]
    assert facts.arch_source == "archflags:libtorch_python.so"


def test_arch_flags_string_is_none_when_ambiguous_or_absent(tmp_path: Path) -> None:
    two = tmp_path / "two.so"
    two.write_bytes(b"\x00sm_70 sm_80\x00\x00sm_75 sm_86\x00")
    assert probes.arch_flags_string(two) is None
    assert probes.arch_flags_string(tmp_path / "absent.so") is None


def test_probe_torch_cpu_build_and_missing_library(tmp_path: Path) -> None:
    fake_torch(tmp_path / "cpu", None, None)
    cpu = probes.probe_torch([str(tmp_path / "cpu")])
    assert cpu.installed and cpu.cuda_version is None
    fake_torch(tmp_path / "nolib", "12.8", None)
    nolib = probes.probe_torch([str(tmp_path / "nolib")])
    assert nolib.arch_list is None and "libtorch_cuda.so" in (nolib.error or "")
    assert not probes.probe_torch([str(tmp_path / "empty")]).installed


def test_parse_nvcc_version() -> None:
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V12.8.93\n"
    assert probes.parse_nvcc_version(text) == "12.8"
    assert probes.parse_nvcc_version("garbage") is None


def test_nvcc_candidates_follow_cuda_home_then_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\n")
    (bin_dir / "nvcc").chmod(0o755)
    env = {"CUDA_HOME": "/opt/cuda-12.8", "PATH": str(bin_dir)}
    got = probes.nvcc_candidates(env)
    assert got[:2] == [Path("/opt/cuda-12.8/bin/nvcc"), bin_dir / "nvcc"]


def test_probe_nvcc_reads_fake_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    facts = probes.probe_nvcc(os.environ)
    assert (facts.found, facts.version, facts.path) == (True, "13.0", str(nvcc))


def test_probe_gpu_records_nvml_init_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise OSError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=fail))
    facts = probes.probe_gpu(os.environ)
    assert not facts.nvml_ok
    assert "NVML Shared Library Not Found" in (facts.error or "")


def test_probe_gpu_reads_devices_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"570.124.06",
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetCudaComputeCapability=lambda h: (7, 0),
        nvmlDeviceGetName=lambda h: "Tesla V100-SXM2-32GB",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=32 * 2**30),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    facts = probes.probe_gpu(os.environ)
    assert facts.nvml_ok and facts.driver_version == "570.124.06"
    assert facts.cuda_driver_version == "12.8"
    assert [(d.compute_capability, d.memory_total_mib) for d in facts.devices] == [
        ("7.0", 32768)
    ] * 2
    assert facts.cuda_visible_devices == "1"


def test_probe_host_reports_drift_of_a_patchable_host(tmp_path: Path) -> None:
    from qpnserve.preflight.checks import check_host
    from qpnserve.preflight.facts import Facts
    from tests.preflight.fake_host import make_fake_host

    make_fake_host(tmp_path, kind="patched")  # has the hook, but not v1.3.0's source
    host = probes.probe_host([str(tmp_path)])
    assert host.kind == "patched" and host.patch_validated is None
    assert "process_weights_after_loading is missing" in (host.patch_error or "")
    result = check_host(Facts(host=host), awq_m1=True)
    assert result.status == "FAIL"
    assert "has the hook, but" in result.reason
    assert check_host(Facts(host=host), awq_m1=False).status == "WARN"


def test_probe_env_keeps_only_route_relevant_variables() -> None:
    env = {
        "VLLM_SM70_AWQ_MOE_BATCHED_GEMM": "0",
        "VLLM_PLUGINS": "x",
        "HOME": "/root",
        "VLLM_OTHER": "1",
    }
    assert probes.probe_env(env) == {"VLLM_PLUGINS": "x", "VLLM_SM70_AWQ_MOE_BATCHED_GEMM": "0"}


def test_probe_does_not_import_torch_or_vllm() -> None:
    code = (
        "import sys\n"
        "from qpnserve.config import load_settings\n"
        "from qpnserve.preflight import run_preflight\n"
        "run_preflight(None, settings=load_settings(), groups={'gpu', 'toolchain'})\n"
        "print(','.join(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
