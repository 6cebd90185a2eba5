"""The route flag is one bool (``awq_m1``) written as exactly "0" or "1" (contract section 5),
and every reader judges a value read back the way the plugin does: the preflight's check, the
route's description in `status` and `up --dry-run`, and the plugin itself."""

from __future__ import annotations

import pytest

from qpnserve.config import ROUTE_FLAG, route_flag_value
from qpnserve.dispatch.flag import parse_route_flag
from qpnserve.errors import DispatchError
from qpnserve.host_routes import route_flag_meaning
from qpnserve.preflight.checks_toolchain import check_route_flag
from qpnserve.preflight.facts import Facts

ACCEPTED = [None, "0", "1"]
REFUSED = ["", " 1", "1 ", "true", "on", "2", "01"]


def test_the_bool_is_written_as_the_contracts_values() -> None:
    assert (route_flag_value(True), route_flag_value(False)) == ("1", "0")


@pytest.mark.parametrize("value", ACCEPTED)
def test_accepted_values_pass_every_reader(value: str | None) -> None:
    assert parse_route_flag(value) is (value == "1")
    env = {} if value is None else {ROUTE_FLAG.name: value}
    assert check_route_flag(Facts(env=env)).status == "PASS"
    assert not route_flag_meaning(value, "patched").startswith("refused")


@pytest.mark.parametrize("value", REFUSED)
def test_refused_values_fail_every_reader(value: str) -> None:
    with pytest.raises(DispatchError):
        parse_route_flag(value)
    assert check_route_flag(Facts(env={ROUTE_FLAG.name: value})).status == "FAIL"
    assert route_flag_meaning(value, "patched").startswith("refused")
