"""toolchain.speculation: a row of `check` (and of `up`'s preflight, which passes the server's
arguments). WARN when the route is asked for and the server will speculate."""

from __future__ import annotations

from qpnserve.preflight.checks_speculation import check_speculation
from qpnserve.preflight.facts import CheckpointFacts, Facts

NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
MOE = {"text_config": {"num_experts": 512, "num_experts_per_tok": 10}}


def facts(env: dict[str, str] | None = None) -> Facts:
    return Facts(
        env=env if env is not None else {}, checkpoint=CheckpointFacts(path="m", config=MOE)
    )


def test_speculation_with_the_route_is_a_warning_that_says_why() -> None:
    row = check_speculation(facts(), NGRAM, awq_m1=True)
    assert (row.name, row.status) == ("toolchain.speculation", "WARN")
    assert "a decode step schedules 4 tokens per request" in row.reason
    assert "--speculative-config" in row.fix


def test_speculation_without_the_route_is_said_but_passes() -> None:
    row = check_speculation(facts(), NGRAM, awq_m1=False)
    assert row.status == "PASS" and row.reason.startswith("speculation on (ngram, k=3;")


def test_check_alone_judges_the_hosts_rule_and_says_the_arguments_were_not_seen() -> None:
    row = check_speculation(facts({"VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS": "1"}), None, awq_m1=True)
    assert row.status == "PASS"
    assert "the host's automatic MTP skips MoE models" in row.reason
    assert row.reason.endswith(
        "the server's own arguments are not known to `check` (`up` checks them)"
    )


def test_without_toolchain_facts_the_check_is_skipped_not_passed() -> None:
    assert check_speculation(Facts(), NGRAM, awq_m1=True).status == "SKIP"
