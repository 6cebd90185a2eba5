"""`up --dry-run` runs what `up` checks before it starts anything (options, state dir, a
recorded server, the port, the preflight), prints the plan, and exits as `up` would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qpnserve import config
from qpnserve.fixtures.checkpoint import write_checkpoint
from tests.lifecycle.conftest import NUM_LAYERS, Env, cli


def test_dry_run_exits_1_on_a_failing_preflight_like_up(env: Env, tmp_path: Path) -> None:
    bad = write_checkpoint(tmp_path / "g128", "group-128", NUM_LAYERS)
    result = cli("up", "--dry-run", "--model", str(bad))
    assert result.exit_code == 1, result.stderr
    assert "error: preflight failed: checkpoint." in result.stderr
    assert f"{config.ROUTE_FLAG.name}=1" in result.stdout.splitlines()  # the plan still shows
    assert not env.server_json.exists()


def test_dry_run_exits_6_on_an_unusable_state_dir_like_up(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(config.STATE_DIR.name, str(blocker / "state"))
    result = cli("up", "--dry-run")
    assert result.exit_code == 6, result.stderr
    assert "error: cannot create the state directory" in result.stderr


def test_dry_run_reports_a_recorded_live_server_as_a_conflict(env: Env) -> None:
    started = cli("up", "--detach", "--json")
    assert started.exit_code == 0, started.stderr
    try:
        result = cli("up", "--dry-run", "--json")
        assert result.exit_code == 4, result.stderr
        assert json.loads(result.stdout)["argv"]
    finally:
        assert cli("down").exit_code == 0


def test_dry_run_of_a_healthy_setup_exits_0_and_writes_no_record(env: Env) -> None:
    result = cli("up", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "preflight: checking" in result.stderr
    assert not env.server_json.exists() and not (env.state / "desired.json").exists()


@pytest.mark.parametrize(
    ("route", "users", "flag"), [("--awq-m1", "0", "1"), ("--no-awq-m1", "1", "0")]
)
def test_up_says_so_when_it_replaces_the_users_route_flag(
    env: Env, monkeypatch: pytest.MonkeyPatch, route: str, users: str, flag: str
) -> None:
    monkeypatch.setenv(config.ROUTE_FLAG.name, users)
    result = cli("up", route, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert f"{config.ROUTE_FLAG.name}={flag}" in result.stdout.splitlines()
    said = [ln for ln in result.stderr.splitlines() if f"{config.ROUTE_FLAG.name}={users}" in ln]
    assert len(said) == 1, result.stderr
    assert f"replaced by {flag}" in said[0]


@pytest.mark.parametrize("value", ["2", "true", "", " 1"])
@pytest.mark.parametrize("route", ["--awq-m1", "--no-awq-m1"])
def test_up_refuses_an_invalid_route_flag_as_check_fails_it(
    env: Env, monkeypatch: pytest.MonkeyPatch, value: str, route: str
) -> None:
    """`check` FAILs toolchain.route_flag; `up` refuses on any FAIL of `check`, this one too."""
    monkeypatch.setenv(config.ROUTE_FLAG.name, value)
    checked = cli("check", route, "--json")
    assert checked.exit_code == 1, checked.output
    failed = [c["name"] for c in json.loads(checked.stdout)["results"] if c["status"] == "FAIL"]
    assert failed == ["toolchain.route_flag"]
    for dry in (["--dry-run"], ["--detach"]):
        result = cli("up", route, *dry)
        assert result.exit_code == 1, result.stderr
        error = result.stderr.splitlines()
        first = next(ln for ln in error if ln.startswith("error: "))
        assert first.startswith(
            f"error: preflight failed: toolchain.route_flag: {config.ROUTE_FLAG.name}="
        )
        assert "replaced" not in result.stderr
        assert not env.server_json.exists()


def test_up_says_nothing_when_the_users_route_flag_already_matches(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.ROUTE_FLAG.name, "1")
    result = cli("up", "--awq-m1", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "replaced" not in result.stderr


def test_up_json_failing_preflight_prints_the_report_and_points_at_check(
    env: Env, tmp_path: Path
) -> None:
    # A group-128 export at TP 2: three checks FAIL, the config's because of the TP alone.
    bad = write_checkpoint(tmp_path / "g128", "group-128", NUM_LAYERS)
    result = cli("up", "--detach", "--json", "--model", str(bad), "--tp", "2")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)  # the same document as `qpnserve check --json`
    failed = [c["name"] for c in report["results"] if c["status"] == "FAIL"]
    assert failed == ["checkpoint.config", "checkpoint.quantization", "checkpoint.tensors"]
    messages = [ln for ln in result.stderr.splitlines() if ln.startswith(("error: ", "hint: "))]
    assert messages == [
        "error: preflight failed: checkpoint.config: moe_intermediate_size 640 / TP 2 = 320 per "
        "rank (the operator needs 160, at TP4); the checkpoint's geometry fits, the TP does not "
        "(and 2 more)",
        "hint: use --tp 4: the route runs at tensor parallel 4, one rank per V100; all 3 FAILs: "
        f"`qpnserve check --model {bad} --tp 2`",
    ]
