"""The stage API `qpnserve up` uses: run_preflight over recorded facts and generated checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from qpnserve.config import load_settings
from qpnserve.errors import UsageError
from qpnserve.preflight import run_preflight
from tests.preflight.conftest import H200_CU130, V100_OK


def test_v100_facts_pass_every_gpu_and_toolchain_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPNSERVE_FACTS_FILE", str(V100_OK))
    report = run_preflight(None, settings=load_settings(), groups={"gpu", "toolchain"})
    assert report.ok
    assert report.facts.source == "recorded"
    assert [r.status for r in report.results] == ["PASS"] * len(report.results)
    assert {r.group for r in report.results} == {"gpu", "toolchain"}


def test_v100_facts_with_healthy_checkpoint_is_ok(
    monkeypatch: pytest.MonkeyPatch, make_ckpt: Callable[..., Path]
) -> None:
    monkeypatch.setenv("QPNSERVE_FACTS_FILE", str(V100_OK))
    report = run_preflight(make_ckpt("ok"), settings=load_settings())
    assert report.ok, [r for r in report.results if r.status != "PASS"]
    assert report.groups == ["gpu", "toolchain", "checkpoint"]
    assert all(r.status == "PASS" for r in report.results)


def test_h200_facts_fail_and_report_is_not_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPNSERVE_FACTS_FILE", str(H200_CU130))
    report = run_preflight(None, settings=load_settings())
    failed = {r.name for r in report.failed()}
    assert not report.ok
    assert {"gpu.compute_capability", "toolchain.torch_arch", "toolchain.nvcc"} <= failed


def test_only_checkpoint_group_ignores_machine_failures(
    monkeypatch: pytest.MonkeyPatch, make_ckpt: Callable[..., Path]
) -> None:
    monkeypatch.setenv("QPNSERVE_FACTS_FILE", str(H200_CU130))
    report = run_preflight(make_ckpt("ok"), settings=load_settings(), groups={"checkpoint"})
    assert report.ok
    assert report.groups == ["checkpoint"]
    assert report.facts.gpu is None


def test_run_preflight_rejects_unknown_group() -> None:
    with pytest.raises(UsageError):
        run_preflight(None, settings=load_settings(), groups={"gpus"})
