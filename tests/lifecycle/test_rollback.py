"""`qpnserve rollback` and the restart-needed state, end to end against the stand-in server."""

from __future__ import annotations

import json

import pytest

from qpnserve import config
from qpnserve.lifecycle.procs import group_members
from tests.lifecycle.conftest import Env, cli, environ_of


def test_rollback_while_running_says_restart_needed_in_status(env: Env) -> None:
    running = json.loads(cli("up", "--detach", "--json").stdout)
    result = cli("rollback")
    assert result.exit_code == 0, result.stderr
    assert "route: off for the next start (desired state saved)" in result.stderr
    assert f"the running server (pid {running['pid']}" in result.stderr
    assert "keeps the AWQ M1 route until it restarts" in result.stderr
    assert "restart needed: yes; run: qpnserve rollback --restart" in result.stderr
    text = cli("status").stdout
    assert "restart needed: yes" in text
    assert "route: running on, desired off" in text
    status = json.loads(cli("status", "--json").stdout)
    assert status["restart_needed"] is True
    assert status["restart_command"] == "qpnserve rollback --restart"
    assert status["running"]["route_flag"] == "1"  # the running server did not change


def test_rollback_restart_clears_restart_needed(env: Env) -> None:
    old = json.loads(cli("up", "--detach", "--json").stdout)
    cli("rollback")
    result = cli("rollback", "--restart", "--json")
    assert result.exit_code == 0, result.stderr
    new = json.loads(result.stdout)["restarted"]
    assert new["pid"] != old["pid"]
    assert group_members(old["pgid"]) == []
    assert environ_of(new["pid"])[config.ROUTE_FLAG.name] == "0"
    status = json.loads(cli("status", "--json").stdout)
    assert status["restart_needed"] is False
    assert status["running"]["route_flag"] == "0"
    assert status["route_text"].startswith("off (VLLM_SM70_AWQ_QWEN38_QPN_M1=0")
    assert "restart needed: no" in cli("status").stdout


def test_rolling_back_twice_is_harmless(env: Env) -> None:
    cli("up", "--detach")
    first = cli("rollback", "--restart", "--json")
    pid = json.loads(first.stdout)["restarted"]["pid"]
    second = cli("rollback", "--restart", "--json")
    assert second.exit_code == 0, second.stderr
    assert "route: already off for the next start; nothing changed" in second.stderr
    assert "already runs without the route; restart needed: no" in second.stderr
    after = json.loads(second.stdout)
    assert after["changed"] is False and after["restarted"] is None
    assert json.loads(cli("status", "--json").stdout)["running"]["pid"] == pid


def test_rollback_with_nothing_running_only_changes_the_next_start(env: Env) -> None:
    result = cli("rollback")
    assert result.exit_code == 0, result.stderr
    assert "no server is running: the next `qpnserve up` starts without the route" in result.stderr
    up = cli("up", "--detach", "--json")  # no --awq-m1/--no-awq-m1: the desired state decides
    assert up.exit_code == 0, up.stderr
    assert "route: off (desired state" in up.stderr
    assert json.loads(up.stdout)["route_flag"] == "0"


def test_rollback_unpatch_leaves_the_plugin_out_of_the_next_start(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.VLLM_PLUGINS.name, f"site_plugin,{config.PLUGIN_NAME}")
    started = cli("up", "--detach")
    assert started.exit_code == 0, started.stderr  # else nothing runs, and nothing restarts
    result = cli("rollback", "--restart", "--unpatch", "--json")
    assert result.exit_code == 0, result.stderr
    restarted = json.loads(result.stdout)["restarted"]
    assert environ_of(restarted["pid"])[config.VLLM_PLUGINS.name] == "site_plugin"
    assert restarted["include_plugin"] is False
    # An explicit --awq-m1 brings the plugin back, keeping the user's other plugin.
    cli("down")
    again = json.loads(cli("up", "--detach", "--awq-m1", "--json").stdout)
    assert environ_of(again["pid"])[config.VLLM_PLUGINS.name] == f"site_plugin,{config.PLUGIN_NAME}"


def test_readme_shows_the_current_rollback_and_status_texts(env: Env) -> None:
    """The README's transcript must not drift from what the commands print."""
    import re

    from tests.lifecycle.conftest import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("<!-- SECTION:lifecycle -->")[1].split("<!-- /SECTION:lifecycle -->")[0]
    cli("up", "--detach")
    texts = cli("rollback").stderr + cli("status").stdout
    volatile = re.compile(r"pid \d+|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|/\S+|:\d{4,5}\b|\d+ processes")
    for line in texts.splitlines():
        if line.startswith(("desired:", "running:", "          log", "          process")):
            continue  # paths, pids, ports and times differ from run to run
        pattern = re.escape(volatile.sub("\0", line)).replace("\0", ".*")
        if "layers admitted" in line:
            pattern = r"route:\s+\d+/\d+ layers admitted on 4/4 ranks"
        if "1-token graph" in line:
            pattern = r"graphs:\s+route captured in the 1-token graph on \d+/\d+ layers on 4/4"
        assert re.search(pattern, section), f"README lacks: {line}"


def test_status_after_rollback_on_a_fresh_state_names_no_model_instead_of_a_question_mark(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(config.MODEL.name)
    assert cli("rollback").exit_code == 0
    desired = next(ln for ln in cli("status").stdout.splitlines() if ln.startswith("desired:"))
    assert "?" not in desired
    assert "route off; no model recorded yet" in desired
