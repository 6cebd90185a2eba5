"""How `up` fills the options the user left out from the desired state (library, not CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve.errors import UsageError
from qpnserve.lifecycle.options import options_from_desired
from qpnserve.state import DesiredState


def test_no_desired_state_and_no_route_option_means_route_on_plugin_in(tmp_path: Path) -> None:
    opts, note = options_from_desired(None, model=tmp_path, awq_m1=None)
    assert opts.awq_m1 and opts.include_plugin and note is None


def test_route_left_out_follows_a_rolled_back_desired_state_and_says_so(tmp_path: Path) -> None:
    desired = DesiredState(awq_m1=False, include_plugin=False, model=str(tmp_path))
    opts, note = options_from_desired(desired, model=None, awq_m1=None, port=9000)
    assert not opts.awq_m1 and not opts.include_plugin
    assert opts.model_dir == tmp_path and opts.port == 9000
    assert note is not None and note.startswith("route: off (desired state")


def test_explicit_awq_m1_brings_the_plugin_back_after_unpatch(tmp_path: Path) -> None:
    desired = DesiredState(awq_m1=False, include_plugin=False, model=str(tmp_path))
    opts, note = options_from_desired(desired, model=None, awq_m1=True)
    assert opts.awq_m1 and opts.include_plugin and note is None


def test_explicit_no_awq_m1_keeps_the_plugin_out_after_unpatch(tmp_path: Path) -> None:
    desired = DesiredState(awq_m1=False, include_plugin=False, model=str(tmp_path))
    opts, _ = options_from_desired(desired, model=None, awq_m1=False)
    assert not opts.awq_m1 and not opts.include_plugin


def test_no_model_anywhere_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--model is required"):
        options_from_desired(DesiredState(awq_m1=True), model=None, awq_m1=None)
