"""`up --awq-m1 --verify`: verify --offline first; start only on a pass; otherwise exit (7
outside the contract, 1 nothing examined) with no server started and the route off for the next
start. The server start itself (lifecycle.up) is replaced by a recorder here: its own tests
cover it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from qpnserve.cli import app
from qpnserve.fixtures.checkpoint import write_checkpoint
from qpnserve.state import read_desired

pytestmark = pytest.mark.usefixtures("cpu_extension")
runner = CliRunner()


@pytest.fixture(scope="module")
def one_seeded_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("up") / "seeded1", "seeded", num_layers=1)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """Records the lifecycle.up calls instead of starting a server; an isolated state dir."""
    calls: list[Any] = []
    monkeypatch.setenv("QPNSERVE_STATE_DIR", str(tmp_path / "state"))
    import qpnserve.lifecycle

    monkeypatch.setattr(qpnserve.lifecycle, "up", lambda opts, **_: calls.append(opts))
    return calls


def _up(model: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["up", "--awq-m1", "--verify", "--model", str(model), *args])


def test_up_verify_starts_the_server_only_after_a_pass(
    one_seeded_layer: Path, started: list[Any]
) -> None:
    result = _up(one_seeded_layer)
    assert result.exit_code == 0, result.stderr
    assert "PASS: 24 samples" in result.stderr
    assert len(started) == 1 and started[0].awq_m1 is True


def test_up_verify_outside_the_contract_exits_7_with_the_route_off_and_no_server(
    one_seeded_layer: Path, started: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from qpnserve.verify import prepare

    real_share = prepare.share
    # a host whose preparation got the zero points wrong
    monkeypatch.setattr(
        prepare, "share", lambda ex, rank, fault=None: real_share(ex, rank, "zero-point-off-by-one")
    )
    result = _up(one_seeded_layer, "--json")
    assert result.exit_code == 7
    assert started == []
    assert "worst layer 0" in result.stderr and "no server was started" in result.stderr
    desired = read_desired(tmp_path / "state")
    assert desired is not None and desired.awq_m1 is False
    assert json.loads(result.stdout)["verdict"] == "outside"


def test_up_verify_that_examined_nothing_is_not_a_pass(tmp_path: Path, started: list[Any]) -> None:
    holes = write_checkpoint(tmp_path / "holes", "ok", num_layers=1)
    result = _up(holes)
    assert result.exit_code == 1
    assert started == []
    assert "nothing was examined" in result.stderr
    desired = read_desired(tmp_path / "state")
    assert desired is not None and desired.awq_m1 is False


def test_up_verify_needs_the_route_on(tmp_path: Path, started: list[Any]) -> None:
    result = runner.invoke(app, ["up", "--no-awq-m1", "--verify", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "--verify verifies the route" in result.stderr
