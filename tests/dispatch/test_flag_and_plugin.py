"""The route flag, the plugin's entry point, and what an off flag leaves untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from qpnserve.config import PLUGIN_NAME, ROUTE_FLAG
from qpnserve.dispatch import parse_route_flag, runtime
from qpnserve.dispatch.wrap import MARKER
from qpnserve.errors import DispatchError
from qpnserve.plugin import register
from tests.dispatch.standin import FakeHost

BAD_VALUES = ["", "2", "true", "True", "-1", " 1", "1 ", "on", "yes", "01", "0.0"]


@pytest.mark.parametrize("raw", BAD_VALUES)
def test_flag_rejects_value_other_than_0_or_1(raw: str) -> None:
    with pytest.raises(DispatchError) as caught:
        parse_route_flag(raw)
    assert ROUTE_FLAG.name in caught.value.message
    assert "'0'" in caught.value.message and "'1'" in caught.value.message


@pytest.mark.parametrize(("raw", "expected"), [(None, False), ("0", False), ("1", True)])
def test_flag_accepts_unset_0_and_1(raw: str | None, expected: bool) -> None:
    assert parse_route_flag(raw) is expected


@pytest.mark.parametrize("raw", ["2", "", "true"])
def test_register_with_bad_flag_raises_naming_variable(
    raw: str, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROUTE_FLAG.name, raw)
    with pytest.raises(DispatchError, match=ROUTE_FLAG.name):
        register()
    assert MARKER not in fake_host.host_class().__dict__


def test_plugin_is_discovered_through_its_entry_point() -> None:
    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == PLUGIN_NAME]
    assert len(found) == 1
    assert found[0].value == "qpnserve.plugin:register"
    assert found[0].load() is register


def _touch_everything(*_: object, **__: object) -> None:
    raise AssertionError("the route flag is off, yet the plugin went past the flag check")


@pytest.mark.parametrize("flag", [None, "0"])
def test_off_flag_never_touches_extension_or_host(
    flag: str | None, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    if flag is not None:
        monkeypatch.setenv(ROUTE_FLAG.name, flag)
    monkeypatch.setattr(runtime, "activate", _touch_everything)
    monkeypatch.setattr(runtime, "load_operator", _touch_everything)
    monkeypatch.setattr("qpnserve.host.detect_host", _touch_everything)
    register()
    assert "vllm" not in sys.modules
    assert MARKER not in fake_host.host_class().__dict__


def test_unset_flag_imports_nothing_heavy_in_a_fresh_process(fake_host: FakeHost) -> None:
    """A fresh interpreter with the fake host on its path: register() with the flag unset
    imports neither vllm, torch, the extension loader nor the host probe."""
    code = (
        "import json, sys\n"
        "from qpnserve.plugin import register\n"
        "register()\n"
        "watched = ('vllm', 'torch', 'pydantic', 'qpnserve.kernels', 'qpnserve.host',\n"
        "           'qpnserve.dispatch.runtime', 'qpnserve.dispatch.wrap')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(watched))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ROUTE_FLAG.name}
    env["PYTHONPATH"] = os.pathsep.join([str(fake_host.site), *sys.path])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_refusal_is_recorded_where_up_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qpnserve.host
    from qpnserve.config import REPORT_DIR
    from qpnserve.route_report import read_refusals

    monkeypatch.setattr(qpnserve.host, "detect_host", lambda: None)
    monkeypatch.setenv(ROUTE_FLAG.name, "1")
    monkeypatch.setenv(REPORT_DIR.name, str(tmp_path))
    with pytest.raises(DispatchError) as caught:
        register()
    [refusal] = read_refusals(tmp_path)
    assert refusal.pid == os.getpid()
    assert refusal.route_flag == "1"
    assert refusal.reason == caught.value.message
    assert "no vllm package" in refusal.reason


def test_off_flag_records_no_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qpnserve.config import REPORT_DIR

    monkeypatch.setenv(ROUTE_FLAG.name, "0")
    monkeypatch.setenv(REPORT_DIR.name, str(tmp_path))
    register()
    assert list(tmp_path.iterdir()) == []
