"""Redaction, on planted values: each secret is built here, never taken from the code under
test, and must not survive in any form the report writes."""

from __future__ import annotations

import pytest

from qpnserve.report.redact import (
    REDACTED,
    redact_argv,
    redact_env,
    redact_text,
    secret_values,
)

HF = "hf_PlantedTokenAbcdefghijkl0123"
KEY = "sk-planted-key-0123456789abc"
PIP_PASSWORD = "pipPlantedPassw0rd"


def test_secret_named_variables_lose_their_values_and_keep_their_names() -> None:
    env = {"HF_TOKEN": HF, "VLLM_API_KEY": KEY, "MY_DB_PASSWORD": "hunter22", "CUDA_HOME": "/c"}
    assert redact_env(env) == {
        "CUDA_HOME": "/c",
        "HF_TOKEN": REDACTED,
        "MY_DB_PASSWORD": REDACTED,
        "VLLM_API_KEY": REDACTED,
    }
    assert secret_values(env) == {HF, KEY, "hunter22"}


def test_token_counts_and_tokenizers_are_not_secrets() -> None:
    env = {"VLLM_MAX_TOKENS": "8192", "TOKENIZERS_PARALLELISM": "false"}
    assert redact_env(env) == env
    argv = ["--max-num-batched-tokens", "8192", "--tokenizer", "/models/t"]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        (f"pkg @ https://user:{PIP_PASSWORD}@pypi.example.com/pkg-1.0.whl", PIP_PASSWORD),
        (f"PIP_INDEX_URL=https://__token__:{PIP_PASSWORD}@idx.example/simple", PIP_PASSWORD),
        (f"git+https://{PIP_PASSWORD}@github.com/org/repo.git", PIP_PASSWORD),
        (f"non-default args: {{'api_key': ['{KEY}']}}", KEY),
        (f"curl -H 'Authorization: Bearer {KEY}'", KEY),
        (f"huggingface token {HF} in a line", HF),
        (f"python -m vllm.entrypoints.openai.api_server --api-key {KEY} --port 8000", KEY),
        (f"vllm serve --hf-token={HF}", HF),
        ("non-default args: {'api_key': ['plainkey99'], 'port': 8000}", "plainkey99"),
        ('{"hf_token": "plaintoken77"}', "plaintoken77"),
    ],
)
def test_credentials_in_free_text_are_redacted_by_form(text: str, gone: str) -> None:
    out = redact_text(text)
    assert gone not in out
    assert REDACTED in out


def test_a_known_secret_is_redacted_by_value_wherever_it_appears() -> None:
    value = "plain-looking-secret-value"
    out = redact_text(f"INFO loading with option x={value} done", {value})
    assert out == f"INFO loading with option x={REDACTED} done"


def test_argv_keeps_options_and_hides_secret_values() -> None:
    argv = ["--api-key", KEY, "--dtype", "float16", f"--hf_token={HF}", "--port", "8000"]
    assert redact_argv(argv) == [
        "--api-key",
        REDACTED,
        "--dtype",
        "float16",
        f"--hf_token={REDACTED}",
        "--port",
        "8000",
    ]


def test_fields_that_only_look_secret_stay_readable() -> None:
    text = '"build_key": "sm70-abc123", "api_key_set": true, "max_num_batched_tokens": 8192'
    assert redact_text(text) == text
