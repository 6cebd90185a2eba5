"""`up`'s build stage: the arch it builds for, and the hint when it cannot pick one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qpnserve import config
from qpnserve.errors import BuildError
from qpnserve.kernels import build, toolchain
from qpnserve.lifecycle.stages import HostSummary, prepare_extension_stage


def test_up_build_stage_honours_qpnserve_build_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_build(arch_list: str | None = None, **_: object) -> build.BuildResult:
        seen["arch_list"] = arch_list
        return build.BuildResult(Path("x.so"), "k", True, ("7.0",), True, "t", "12.8")

    monkeypatch.setattr(build, "build", fake_build)
    monkeypatch.setenv(config.BUILD_ARCH.name, "7.0")
    assert prepare_extension_stage(HostSummary("patched", "1.3.0"), lambda _: None) == "k"
    assert seen["arch_list"] == "7.0"


def test_no_visible_gpu_hint_names_what_up_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`up` has no --arch: the hint must also name the variable that `up` reads."""
    monkeypatch.setenv(config.BUILD_DIR.name, str(tmp_path))
    monkeypatch.setattr(toolchain, "local_arch_list", lambda: ())
    # A CUDA torch with no GPU in sight (a CPU torch is refused before any arch advice).
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(BuildError) as info:
        build.build()
    assert "no CUDA GPU is visible" in info.value.message
    assert f"{config.BUILD_ARCH.name}=7.0" in (info.value.hint or "")
