"""Fixtures of the dispatch tests: a fake installed host on sys.path, a report directory, a
manifest whose validated build is that fake host, and a spy in place of the extension."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qpnserve.config import REPORT_DIR, ROUTE_FLAG
from qpnserve.dispatch import runtime
from qpnserve.dispatch.manifest import (
    PatchManifest,
    ValidatedBuild,
    installed_fingerprints,
    load_manifest,
)
from tests.dispatch.standin import FakeHost, SpyOperator, forget_vllm_modules, write_fake_host

TEST_BUILD_KEY = "test-build-key"


def manifest_validating(host: FakeHost, version: str = "1.3.0") -> PatchManifest:
    """The shipped manifest, with its validated builds replaced by this fake host's source."""
    manifest = load_manifest()
    build = ValidatedBuild(
        distribution="1cat-vllm",
        version=version,
        source="tests/dispatch/standin.py",
        obtained_by="installed_fingerprints() in the test",
        fingerprints={
            k: v for k, v in installed_fingerprints(manifest, host.package_dir).items() if v
        },
    )
    return manifest.model_copy(update={"validated": [build]})


@pytest.fixture(autouse=True)
def _flag_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dispatch test starts with the route flag unset, whatever the caller's shell says."""
    monkeypatch.delenv(ROUTE_FLAG.name, raising=False)


@pytest.fixture
def report_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "reports"
    monkeypatch.setenv(REPORT_DIR.name, str(path))
    return path


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> FakeHost:
    forget_vllm_modules()
    host = write_fake_host(tmp_path / "site", **kwargs)  # type: ignore[arg-type]
    monkeypatch.syspath_prepend(str(host.site))
    return host


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    """A patchable stand-in host (1cat-vllm 1.3.0) importable as ``vllm``."""
    yield _install(tmp_path, monkeypatch)
    forget_vllm_modules()


@pytest.fixture
def native_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    """A native stand-in host: envs.py knows the flag and the native op name is present."""
    yield _install(tmp_path, monkeypatch, native=True)
    forget_vllm_modules()


@pytest.fixture
def spy_op(monkeypatch: pytest.MonkeyPatch) -> SpyOperator:
    """The extension load replaced by a spy operator (records calls, writes a marker)."""
    spy = SpyOperator()
    monkeypatch.setattr(runtime, "load_operator", lambda _: (spy, TEST_BUILD_KEY, ("7.0",)))
    return spy


@pytest.fixture
def validated_fake(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    """The fake host, with the plugin's manifest validating exactly its source."""
    manifest = manifest_validating(fake_host)
    monkeypatch.setattr(runtime, "load_manifest", lambda: manifest)
    return fake_host
