"""Build keys, toolkit refusals, and `qpnserve build` / `load` on the CPU-only build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qpnserve.config import load_settings
from qpnserve.errors import BuildError, ExitCode, UsageError
from qpnserve.kernels import build, toolchain


def test_arch_list_accepts_common_spellings_and_rejects_junk() -> None:
    assert toolchain.normalize_arch_list("9.0;7.0") == ("7.0", "9.0")
    assert toolchain.normalize_arch_list(["sm_70", "80"]) == ("7.0", "8.0")
    with pytest.raises(UsageError):
        toolchain.normalize_arch_list("volta")


def test_build_key_depends_on_arch_list_and_cuda() -> None:
    key_70 = build.build_key("7.0", with_cuda=True)
    assert key_70 == build.build_key(["7.0"], with_cuda=True)
    assert key_70 != build.build_key("9.0", with_cuda=True)
    assert key_70 != build.build_key("7.0", with_cuda=False)


def test_build_key_covers_every_csrc_source() -> None:
    names = {p.name for p in build.source_files()}
    assert {"awq_moe_m1.cpp", "awq_moe_m1_cuda.cu", "awq_moe_m1_kernels.cuh"} <= names


def test_server_library_sources_hold_no_bench_code() -> None:
    # The library a server loads is compiled from these; the read floor, the derive kernel and
    # the traced copy live in the bench extension only (read from the files, not the names).
    op_units = build.compiled_sources("op", cpu_only=False)
    assert {p.name for p in op_units} == {
        "awq_moe_m1.cpp",
        "awq_moe_m1_cpu.cpp",
        "awq_moe_m1_cuda.cu",
    }
    for path in build.source_files("op"):
        text = path.read_text()
        for marker in ("read_floor_m1", "derive_input_m1", "qpnserve_bench", "#define QPN_TRACE 1"):
            assert marker not in text, (path.name, marker)
    bench_units = {p.name for p in build.compiled_sources("bench", cpu_only=False)}
    assert bench_units == {"bench_floor.cu", "bench_trace.cu"}
    assert build.build_key("9.0", True, "bench") != build.build_key("9.0", True, "op")


def test_toolkit_refusal_names_cuda13_for_sm70() -> None:
    refusal = toolchain.toolkit_refusal(("7.0",), (13, 0), "13.0")
    assert refusal is not None and "sm_70" in refusal.message and "CUDA 13.0" in refusal.message
    assert toolchain.toolkit_refusal(("9.0",), (13, 0), "13.0") is None
    assert toolchain.toolkit_refusal(("7.0",), (12, 8), "12.8") is None


def test_toolkit_refusal_without_cuda_torch_or_nvcc() -> None:
    no_torch_cuda = toolchain.toolkit_refusal(("7.0",), (12, 8), None)
    assert no_torch_cuda is not None and "no CUDA support" in no_torch_cuda.message
    no_nvcc = toolchain.toolkit_refusal(("7.0",), None, "12.8")
    assert no_nvcc is not None and "nvcc" in no_nvcc.message


def test_load_without_a_build_raises_with_the_build_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPNSERVE_BUILD_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(build, "_LOADED", {})
    with pytest.raises(BuildError) as info:
        build.load(arch_list="7.0", build_dir=load_settings().build_dir)
    assert "qpnserve build" in (info.value.hint or "")


def _cli(args: list[str], build_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, QPNSERVE_BUILD_DIR=str(build_dir))
    return subprocess.run(
        [sys.executable, "-m", "qpnserve", "build", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def test_cli_build_cpu_only_reuses_the_cached_build(cpu_extension) -> None:  # type: ignore[no-untyped-def]
    result = _cli(["--cpu-only", "--json"], cpu_extension.path.parent.parent)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["reused"] is True
    assert data["build_key"] == cpu_extension.build_key
    assert Path(data["path"]).is_file()


def test_cli_build_refuses_cuda_build_on_cpu_torch(tmp_path: Path) -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA")
    result = _cli(["--arch", "7.0"], tmp_path)
    assert result.returncode == int(ExitCode.BUILD)
    assert result.stderr.startswith("error: this torch has no CUDA support")
    assert "Traceback" not in result.stderr


def test_cli_build_rejects_unknown_arch_as_usage_error(tmp_path: Path) -> None:
    result = _cli(["--arch", "volta", "--json"], tmp_path)
    assert result.returncode == int(ExitCode.USAGE)
    document = json.loads(result.stdout)  # --json: one document, a failure's too
    assert (document["kind"], document["command"], document["exit_code"]) == (
        "qpnserve.error",
        "build",
        2,
    )
    assert "volta" in document["error"]


def test_cli_build_json_failure_of_the_toolkit_is_one_document(tmp_path: Path) -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA")
    result = _cli(["--arch", "7.0", "--json"], tmp_path)
    assert result.returncode == int(ExitCode.BUILD)
    document = json.loads(result.stdout)
    assert document["exit_code"] == 3 and "no CUDA support" in document["error"]


def test_cli_build_on_cpu_torch_without_arch_names_the_cpu_torch_first(tmp_path: Path) -> None:
    # No GPU and a CPU torch: "pass --arch 7.0" would only lead to this error next.
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA")
    result = _cli([], tmp_path)
    assert result.returncode == int(ExitCode.BUILD)
    assert result.stderr.startswith("error: this torch has no CUDA support"), result.stderr
    assert "--arch" not in result.stderr


_WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.argv[0] = 'qpnserve'; "
    "from qpnserve.cli import main; main()"
)


def _without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "build", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, QPNSERVE_BUILD_DIR=str(tmp_path)),
        timeout=120,
    )


@pytest.mark.parametrize("args", [["--cpu-only"], ["--arch", "7.0"]], ids=["cpu-only", "arch"])
def test_cli_build_without_torch_is_one_line_and_exit_3(tmp_path: Path, args: list[str]) -> None:
    """The README's first command runs where the host's torch may be missing."""
    result = _without_torch(tmp_path, *args)
    assert result.returncode == int(ExitCode.BUILD), result.stderr
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: torch is not installed"), result.stderr


def test_cli_build_cpu_only_without_torch_hints_the_test_extra(tmp_path: Path) -> None:
    # On a laptop the CPU build needs any torch: the test extra's, not the V100 host's Python.
    hint = _without_torch(tmp_path, "--cpu-only").stderr.splitlines()[1]
    assert hint.startswith("hint: install the test extra's CPU torch"), hint
    assert ".[test]" in hint


def test_cli_build_bad_arch_without_torch_is_a_usage_error(tmp_path: Path) -> None:
    result = _without_torch(tmp_path, "--arch", "banana")
    assert result.returncode == int(ExitCode.USAGE), result.stderr
    assert result.stderr.startswith("error: unknown CUDA arch 'banana'"), result.stderr
