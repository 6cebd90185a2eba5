"""The shipped manifest, and the drift check of the installed host source against it."""

from __future__ import annotations

import inspect
import re

import pytest

from qpnserve.dispatch.manifest import (
    installed_fingerprints,
    load_manifest,
    match_validated_build,
)
from qpnserve.errors import DispatchError
from tests.dispatch.conftest import manifest_validating
from tests.dispatch.standin import FakeHost


def test_shipped_manifest_documents_target_and_a_validated_1cat_build() -> None:
    manifest = load_manifest()
    assert manifest.target.class_name == "AWQSM70MoEMethod"
    assert manifest.target.wrapped == [
        "process_weights_after_loading",
        "_apply_legacy_single_token_compact",
    ]
    for text in (manifest.why, manifest.how, manifest.upstream, manifest.remove_when):
        assert len(text.strip()) > 40
    versions = {(b.distribution, b.version) for b in manifest.validated}
    assert ("1cat-vllm", "1.3.0") in versions
    for build in manifest.validated:
        assert set(build.fingerprints) == set(manifest.target.fingerprinted)
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", v) for v in build.fingerprints.values())
        assert "fingerprint_host.py" in build.obtained_by


def test_standin_signatures_match_the_manifest(fake_host: FakeHost) -> None:
    """The stand-in takes exactly the parameters recorded from the real v1.3.0 source."""
    cls = fake_host.host_class()
    for name, params in load_manifest().target.signatures.items():
        assert list(inspect.signature(getattr(cls, name)).parameters) == params


def test_drifted_fingerprint_refuses_naming_method_and_version(fake_host: FakeHost) -> None:
    """The stand-in is not v1.3.0's source, so the shipped manifest must refuse it."""
    manifest = load_manifest()
    installed = installed_fingerprints(manifest, fake_host.package_dir)
    with pytest.raises(DispatchError) as caught:
        match_validated_build(manifest, "1.3.0", installed)
    assert "AWQSM70MoEMethod.process_weights_after_loading" in caught.value.message
    assert "1cat-vllm 1.3.0" in caught.value.message


def test_one_changed_line_in_the_hook_refuses(fake_host: FakeHost) -> None:
    manifest = manifest_validating(fake_host)
    fake_host.edit_source("output.fill_(HOST_ROUTE_VALUE)", "output.fill_(HOST_ROUTE_VALUE + 1)")
    installed = installed_fingerprints(manifest, fake_host.package_dir)
    with pytest.raises(DispatchError, match="_apply_legacy_single_token_compact in installed"):
        match_validated_build(manifest, "1.3.0", installed)


def test_reindented_source_keeps_its_fingerprint(fake_host: FakeHost) -> None:
    manifest = manifest_validating(fake_host)
    text = fake_host.module_file.read_text()
    fake_host.module_file.write_text(
        text.replace("        return output\n", "        return output   \n")
    )
    installed = installed_fingerprints(manifest, fake_host.package_dir)
    assert match_validated_build(manifest, "1.3.0", installed).version == "1.3.0"


def test_unlisted_version_with_identical_source_is_accepted(fake_host: FakeHost) -> None:
    manifest = manifest_validating(fake_host)
    installed = installed_fingerprints(manifest, fake_host.package_dir)
    assert match_validated_build(manifest, "1.3.1", installed).version == "1.3.0"
    assert match_validated_build(manifest, "1.3.0+cu128", installed).version == "1.3.0"


def test_unlisted_version_with_changed_source_refuses(fake_host: FakeHost) -> None:
    manifest = manifest_validating(fake_host)
    fake_host.edit_source("top_k = topk_ids.shape[1]", "top_k = int(topk_ids.shape[1])")
    installed = installed_fingerprints(manifest, fake_host.package_dir)
    with pytest.raises(DispatchError) as caught:
        match_validated_build(manifest, "1.4.0", installed)
    assert "1cat-vllm 1.4.0 is not a validated host build" in caught.value.message
    assert "AWQSM70MoEMethod.apply" in caught.value.message


def test_missing_hook_method_refuses(tmp_path, monkeypatch) -> None:
    from tests.dispatch.standin import write_fake_host

    host = write_fake_host(tmp_path / "site", with_hook=False)
    manifest = load_manifest()
    installed = installed_fingerprints(manifest, host.package_dir)
    with pytest.raises(DispatchError, match="_apply_legacy_single_token_compact is missing"):
        match_validated_build(manifest, "1.3.0", installed)


def test_verify_installed_reads_files_without_importing_the_host(fake_host: FakeHost) -> None:
    import sys

    manifest = manifest_validating(fake_host)
    from qpnserve.dispatch.manifest import verify_installed

    assert verify_installed(fake_host.package_dir, "1.3.0", manifest).version == "1.3.0"
    with pytest.raises(DispatchError):
        verify_installed(fake_host.package_dir, "1.3.0")  # the shipped manifest: drift
    assert "vllm" not in sys.modules
