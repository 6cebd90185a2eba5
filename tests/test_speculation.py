"""qpnserve.speculation: speculation decided from the launch (arguments, environment, the
host's automatic MTP rule), never assumed, and said in plain words. Expected values are the
literal inputs (k=4 makes 5-row steps), not the module's own helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve.speculation import decide, declared, route_meaning

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
MOE_CONFIG = {"text_config": {"num_experts": 512, "num_experts_per_tok": 10}}
DENSE_MTP_CONFIG = {"text_config": {"mtp_num_hidden_layers": 1, "hidden_size": 2560}}
OPT_IN = {"VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS": "1"}


@pytest.mark.parametrize(
    "args",
    [
        ["--speculative-config", NGRAM],
        [f"--speculative-config={NGRAM}"],
        ["--speculative_config", NGRAM],
        ["-sc", NGRAM],
        [
            "--speculative-config.method",
            "ngram",
            "--speculative-config.num_speculative_tokens",
            "4",
        ],
        ["--spec-method", "ngram", "--spec-tokens", "4"],
        ["--max-num-seqs", "8", "--speculative-config.method=ngram", "--spec-tokens=4"],
    ],
)
def test_every_spelling_of_the_speculative_config_is_read(args: list[str]) -> None:
    config = declared(args)
    assert config is not None
    assert (config["method"], config["num_speculative_tokens"]) == ("ngram", 4)
    spec = decide(args, {}, MOE_CONFIG)
    assert (spec.on, spec.method, spec.num_speculative_tokens, spec.step_rows) == (
        True,
        "ngram",
        4,
        5,
    )


def test_no_speculation_arguments_declare_nothing() -> None:
    assert (
        declared(["--max-num-seqs", "8", "--no-enable-prefix-caching", "--dtype", "half"]) is None
    )


def test_a_moe_model_never_gets_the_hosts_automatic_mtp() -> None:
    spec = decide([], OPT_IN, MOE_CONFIG, compute_capability="7.0")
    assert spec.on is False
    assert "skips MoE models" in spec.source


def host_with_rule(tmp_path: Path, has_rule: bool) -> Path:
    package = tmp_path / "vllm"
    (package / "engine").mkdir(parents=True)
    body = "def _maybe_apply_sm70_mtp_defaults(self):\n    pass\n" if has_rule else "x = 1\n"
    (package / "engine" / "arg_utils.py").write_text(body)
    return package


def test_the_automatic_mtp_turns_speculation_on_only_when_every_condition_holds(
    tmp_path: Path,
) -> None:
    host = host_with_rule(tmp_path, has_rule=True)
    spec = decide([], OPT_IN, DENSE_MTP_CONFIG, compute_capability="7.0", host_package_dir=host)
    assert (spec.on, spec.method, spec.num_speculative_tokens) == (True, "mtp", 4)


@pytest.mark.parametrize(
    ("env", "config", "capability", "has_rule", "why"),
    [
        ({}, DENSE_MTP_CONFIG, "7.0", True, "opt-in"),
        ({"VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS": "0"}, DENSE_MTP_CONFIG, "7.0", True, "opt-in"),
        (
            {**OPT_IN, "VLLM_1CAT_DISABLE_QWEN35_MTP_DEFAULTS": "1"},
            DENSE_MTP_CONFIG,
            "7.0",
            True,
            "opted out",
        ),
        (OPT_IN, {"text_config": {"hidden_size": 8}}, "7.0", True, "no MTP layers"),
        (OPT_IN, DENSE_MTP_CONFIG, "8.0", True, "sm_70 only"),
        (OPT_IN, DENSE_MTP_CONFIG, "7.0", False, "no automatic MTP"),
    ],
)
def test_the_automatic_mtp_stays_off_when_a_condition_fails(
    tmp_path: Path,
    env: dict[str, str],
    config: dict[str, object],
    capability: str,
    has_rule: bool,
    why: str,
) -> None:
    host = host_with_rule(tmp_path, has_rule)
    spec = decide([], env, config, compute_capability=capability, host_package_dir=host)
    assert spec.on is False
    assert why in spec.source


def test_what_cannot_be_known_is_unknown_not_off() -> None:
    # An opt-in value the host's int() refuses, and a model config nobody read.
    assert decide([], {"VLLM_1CAT_ENABLE_SM70_MTP_DEFAULTS": "yes"}, DENSE_MTP_CONFIG).on is None
    assert decide([], OPT_IN, None).on is None


def test_route_meaning_says_k_plus_one_rows_and_that_the_route_does_not_fire() -> None:
    line = route_meaning(decide(["--speculative-config", NGRAM], {}, MOE_CONFIG), "0.13 at C1")
    assert line.startswith("speculation on (ngram, k=4; --speculative-config in the server")
    assert "a decode step schedules 5 tokens per request" in line
    assert "the M=1 route does not fire on decode" in line
    assert "even a 1-token step replays a 5-row graph" in line
    assert line.endswith("; measured 0.13 at C1")


def test_route_meaning_without_speculation_names_the_step_the_route_serves() -> None:
    line = route_meaning(decide([], {}, MOE_CONFIG))
    assert line.startswith("speculation off (no --speculative-config; ")
    assert "a decode step of one request schedules one token, the step the M=1 route serves" in line


def test_a_server_that_counts_drafts_is_speculating_even_when_k_is_not_known() -> None:
    from qpnserve.speculation import from_server

    line = route_meaning(from_server(True))
    assert line.startswith("speculation on (its /metrics counts draft tokens): ")
    assert "a decode step schedules k+1 tokens per request" in line
    assert route_meaning(from_server(False)).startswith(
        "speculation off (its /metrics counts no draft tokens): "
    )
