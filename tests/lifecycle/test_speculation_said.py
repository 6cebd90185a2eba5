"""`up` (dry run and start) and `status` say in plain words whether the server speculates and
what that means for the route, from the launch's own arguments (qpnserve.speculation)."""

from __future__ import annotations

import json

from tests.lifecycle.conftest import Env, cli

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4}'


def test_dry_run_says_speculation_on_from_the_users_arguments(env: Env) -> None:
    result = cli("up", "--dry-run", "--", "--speculative-config", NGRAM)
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("# speculation")]
    assert len(said) == 1, result.stdout
    assert said[0].startswith("# speculation on (ngram, k=4; --speculative-config in the server")
    assert "a decode step schedules 5 tokens per request" in said[0]
    assert "the M=1 route does not fire on decode" in said[0]
    plan = json.loads(cli("up", "--dry-run", "--json", "--", "-sc", NGRAM).stdout)
    assert plan["speculation"].startswith("speculation on (ngram, k=4;")


def test_dry_run_without_speculation_says_off_and_why(env: Env) -> None:
    result = cli("up", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    # The synthetic checkpoint is the route's MoE model: the host never adds MTP to it.
    assert json.loads(result.stdout)["speculation"].startswith(
        "speculation off (no --speculative-config; the host's automatic MTP skips MoE models)"
    )


def test_up_and_status_say_it_for_the_started_server(env: Env) -> None:
    started = cli("up", "--detach", "--", "--speculative-config", NGRAM)
    try:
        assert started.exit_code == 0, started.stderr
        assert "speculation on (ngram, k=4;" in started.stderr
        status = json.loads(cli("status", "--json").stdout)
        # The stand-in has no vLLM /metrics, so status judges the recorded launch.
        assert status["speculation_text"].startswith("speculation on (ngram, k=4;")
        assert status["single_token_step_share"] is None
        assert status["steps_text"].startswith("single-token step share: none (")
    finally:
        assert cli("down").exit_code == 0
