"""On a native host the plugin only watches: no failure of its own may stop the server. On a
patched host it still fails closed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qpnserve.config import REPORT_DIR, ROUTE_FLAG, load_settings
from qpnserve.dispatch import runtime
from qpnserve.dispatch.wrap import MARKER
from qpnserve.errors import DispatchError
from qpnserve.plugin import register
from tests.dispatch.standin import FakeHost, StandInLayer, prepared_banks

LOGGER = "vllm.qpnserve_awq_m1"


@pytest.fixture(autouse=True)
def _flag_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, "1")


def _broken_manifest() -> None:
    raise DispatchError("the patch manifest awq_m1_dispatch.toml is invalid: test")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_native_host_with_broken_manifest_is_still_observed(
    native_host: FakeHost, report_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load_manifest", _broken_manifest)
    register()
    assert native_host.host_class().__dict__[MARKER]["mode"] == "observe"


def test_patched_host_with_broken_manifest_still_refuses(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load_manifest", _broken_manifest)
    with pytest.raises(DispatchError, match="manifest"):
        register()


def test_native_host_whose_module_import_raises_gives_one_warning(
    native_host: FakeHost,
    report_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    native_host.edit_source(
        "NATIVE = True", "NATIVE = True\nraise RuntimeError('CUDA init failed in the host')"
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    activation = runtime.activate(load_settings())
    assert (activation.host_kind, activation.mode) == ("native", "none")
    (line,) = _warnings(caplog)
    assert "RuntimeError: CUDA init failed in the host" in line
    assert not report_dir.exists()


def test_native_host_unwritable_report_keeps_the_worker_alive(
    native_host: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the report directory should be\n")
    monkeypatch.setenv(REPORT_DIR.name, str(blocker / "reports"))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    register()
    cls = native_host.host_class()
    for index in range(3):
        layer = StandInLayer(
            stand_in_prepared=prepared_banks(),
            layer_name=f"model.language_model.layers.{index}.mlp.experts",
        )
        cls(4, 32, True, layer).process_weights_after_loading(layer)  # type: ignore[call-arg]
        assert layer.sm70_awq_qwen38_qpn_m1 is True  # the host's own init ran to the end
    (line,) = _warnings(caplog)
    assert "cannot write the route report" in line
