"""The frozen prompt: identical ids every time; files give ids or text."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve.bench.prompt import generated_prompt_ids, load_prompt, parse_prompt_text
from qpnserve.errors import UsageError


def test_generated_prompt_ids_are_frozen_and_in_range() -> None:
    ids = generated_prompt_ids(256)
    assert ids == generated_prompt_ids(256)
    assert ids[:3] == [1017, 8936, 16855]  # the formula is part of the benchmark's identity
    assert all(1000 <= i < 31000 for i in ids)
    assert len(set(ids)) == 256


def test_same_prompt_gives_same_sha_and_different_prompt_does_not() -> None:
    _, a = load_prompt(64, None)
    _, b = load_prompt(64, None)
    _, c = load_prompt(65, None)
    assert a.sha256 == b.sha256 != c.sha256
    assert a.num_tokens == 64 and a.kind == "token_ids"


@pytest.mark.parametrize("text", ["[5, 6, 7]", "5 6 7\n", "5,6,7"])
def test_prompt_file_of_ids_gives_token_ids(text: str) -> None:
    assert parse_prompt_text(text) == [5, 6, 7]


def test_prompt_file_of_text_is_sent_as_text(tmp_path: Path) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text("Explain the V100 memory hierarchy.")
    prompt, info = load_prompt(None, path)
    assert prompt == "Explain the V100 memory hierarchy."
    assert (info.kind, info.num_tokens, info.source) == ("text", None, "prompt.txt")


def test_both_prompt_options_are_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="either --prompt-tokens or --prompt-file"):
        load_prompt(8, tmp_path / "p.txt")


def test_missing_or_empty_prompt_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the prompt file"):
        load_prompt(None, tmp_path / "absent.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(UsageError, match="empty"):
        load_prompt(None, tmp_path / "empty.txt")
