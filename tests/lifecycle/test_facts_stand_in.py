"""A facts file that stands in for this machine is visible wherever it is used: `check`, `up`
(and its dry run) and `status` name the file, so a demo's "host patched 1.3.0" is never taken
for what serves."""

from __future__ import annotations

import json

from qpnserve import config
from qpnserve.host import HostInfo
from tests.lifecycle.conftest import FACTS_V100_OK, Env, cli

STAND_IN = f"from {config.FACTS_FILE.name}={FACTS_V100_OK}"


def test_check_says_its_facts_come_from_the_file_not_this_machine(env: Env) -> None:
    result = cli("check", "--only", "gpu,toolchain")
    assert result.exit_code == 0, result.output
    said = [ln for ln in result.stdout.splitlines() if STAND_IN in ln]
    assert len(said) == 1, result.stdout
    assert "not probed from this machine" in said[0]
    facts = json.loads(cli("check", "--only", "gpu,toolchain", "--json").stdout)["facts"]
    assert facts["source"] == "recorded"
    assert facts["source_file"] == str(FACTS_V100_OK)


def test_up_dry_run_says_its_preflight_facts_come_from_the_file(env: Env) -> None:
    result = cli("up", "--dry-run")
    assert result.exit_code == 0, result.stderr
    said = [ln for ln in result.stderr.splitlines() if STAND_IN in ln]
    assert len(said) == 1, result.stderr
    assert said[0].startswith("preflight: ") and "not probed from this machine" in said[0]
    assert STAND_IN in result.stdout  # the plan's host line


def test_status_says_the_host_it_shows_comes_from_the_file(env: Env) -> None:
    started = cli("up", "--detach", "--json")
    assert started.exit_code == 0, started.stderr
    assert STAND_IN in started.stderr
    try:
        assert json.loads(started.stdout)["facts_file"] == str(FACTS_V100_OK)
        text = cli("status").stdout
        host_line = next(ln for ln in text.splitlines() if "host patched 1.3.0" in ln)
        assert f"host patched 1.3.0 ({STAND_IN}, not probed)" in host_line
    finally:
        assert cli("down").exit_code == 0


def test_status_of_a_probed_host_names_no_facts_file(env: Env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from qpnserve.lifecycle import stages
    from tests.lifecycle.stages import test_stages

    # The preflight reads the file; the server's record must not claim one it was not given.
    probed = test_stages()
    real = probed.preflight

    def preflight_without_file(opts, server_env, progress, settings):  # type: ignore[no-untyped-def]
        summary = real(opts, server_env, progress, settings)
        return HostInfo(found=True, kind=summary.kind, version=summary.version)

    probed.preflight = preflight_without_file
    monkeypatch.setattr(stages, "default_stages", lambda: probed)
    started = cli("up", "--detach", "--json")
    assert started.exit_code == 0, started.stderr
    try:
        assert json.loads(started.stdout)["facts_file"] is None
        assert config.FACTS_FILE.name not in cli("status").stdout
    finally:
        assert cli("down").exit_code == 0
