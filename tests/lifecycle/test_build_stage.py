"""`up`'s build stage: the arch it builds for, and the hint when it cannot pick one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qpnserve import config
from qpnserve.config import Settings, load_settings
from qpnserve.errors import BuildError
from qpnserve.host import HostInfo
from qpnserve.kernels import build, toolchain
from qpnserve.lifecycle import stages
from qpnserve.lifecycle.options import Progress
from qpnserve.lifecycle.stages import (
    Stages,
    prepare_extension_stage,
    run_preflight_stage,
)
from tests.lifecycle.conftest import Env, cli

PATCHED = HostInfo(found=True, kind="patched", version="1.3.0")


@pytest.mark.parametrize(("arch", "expected"), [("7.0", "7.0"), ("7.5", "7.5"), (None, None)])
def test_up_build_stage_honours_qpnserve_build_arch(
    monkeypatch: pytest.MonkeyPatch, arch: str | None, expected: str | None
) -> None:
    """The arch list comes from $QPNSERVE_BUILD_ARCH; unset, the build picks the visible GPUs."""
    asked: list[object] = []

    def fake_build(arch_list: str | None = None, **_: object) -> build.BuildResult:
        asked.append(arch_list)
        return build.BuildResult(Path("x.so"), "k", True, ("7.0",), True, "t", "12.8")

    monkeypatch.setattr(build, "build", fake_build)
    if arch is None:
        monkeypatch.delenv(config.BUILD_ARCH.name, raising=False)
    else:
        monkeypatch.setenv(config.BUILD_ARCH.name, arch)
    said: list[str] = []
    prepare_extension_stage(PATCHED, said.append, load_settings())
    assert asked == [expected]
    where = f"{config.BUILD_ARCH.name}={arch}" if arch else "the visible GPUs"
    assert said[0] == f"extension: building or reusing the AWQ M1 operator for {where}"


@pytest.mark.parametrize(("reused", "verb"), [(True, "reused"), (False, "built")])
def test_up_build_stage_says_whether_it_built_or_reused_and_records_that_key(
    monkeypatch: pytest.MonkeyPatch, reused: bool, verb: str
) -> None:
    key = f"cu128-sm70-{verb}"

    def fake_build(**_: object) -> build.BuildResult:
        return build.BuildResult(Path("x.so"), key, reused, ("7.0",), True, "t", "12.8")

    monkeypatch.setattr(build, "build", fake_build)
    said: list[str] = []
    recorded = prepare_extension_stage(PATCHED, said.append, load_settings())
    assert said[-1] == f"extension: {verb} {key}"
    assert recorded == key  # what `up` writes as the running server's build_key


def test_no_visible_gpu_hint_names_what_up_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`up` has no --arch: the hint must also name the variable that `up` reads."""
    monkeypatch.setenv(config.BUILD_DIR.name, str(tmp_path))
    monkeypatch.setattr(toolchain, "local_arch_list", lambda: ())
    # A CUDA torch with no GPU in sight (a CPU torch is refused before any arch advice).
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(BuildError) as info:
        build.build(build_dir=tmp_path)
    assert "no CUDA GPU is visible" in info.value.message
    assert f"{config.BUILD_ARCH.name}=7.0" in (info.value.hint or "")


def _failing_build(host: HostInfo, progress: Progress, settings: Settings) -> str:
    raise BuildError("no nvcc found: the operator cannot be built", hint="install CUDA 12.8")


@pytest.mark.parametrize("detach", [["--detach"], []])
def test_up_json_prints_one_document_when_the_build_stage_fails(
    env: Env, monkeypatch: pytest.MonkeyPatch, detach: list[str]
) -> None:
    failing = Stages(preflight=run_preflight_stage, prepare_extension=_failing_build)
    monkeypatch.setattr(stages, "default_stages", lambda: failing)
    result = cli("up", "--awq-m1", *detach, "--json")
    assert result.exit_code == 3, result.output
    document = json.loads(result.stdout)  # exactly one JSON document, nothing else
    assert document == {
        "kind": "qpnserve.error",
        "ok": False,
        "command": "up",
        "exit_code": 3,
        "error": "no nvcc found: the operator cannot be built",
        "hint": "install CUDA 12.8",
    }
    assert "error: no nvcc found: the operator cannot be built" in result.stderr.splitlines()
    assert not env.server_json.exists()


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["up", "--json"], 2, "--model is required"),
        (["up", "--dry-run", "--json", "--", "--port", "9"], 2, "pass --port as qpnserve's own"),
    ],
)
def test_up_json_prints_one_document_when_its_options_are_refused(
    env: Env, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, words: str
) -> None:
    monkeypatch.delenv(config.MODEL.name)
    if "--dry-run" in args:
        args = [*args[:1], "--model", str(env.model), *args[1:]]
    result = cli(*args)
    assert result.exit_code == code, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["exit_code"] == code
    assert document["error"].startswith(words)
