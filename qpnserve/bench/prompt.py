"""The frozen prompt: the same token ids every run and every arm of an A/B.

Generated ids follow a fixed formula (no RNG, no tokenizer), so two machines, two qpnserve
versions and two arms send byte-identical prompts; the report carries the prompt's sha256 so
`bench compare` can prove it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from qpnserve.bench.models import PromptInfo
from qpnserve.errors import UsageError

# Ids in [1000, 31000): clear of the special and control tokens that tokenizers put at the
# bottom of the vocabulary, and inside every vocabulary of the Qwen family (151k).
_ID_BASE = 1000
_ID_SPAN = 30000
_ID_STRIDE = 7919  # a prime, coprime with the span: consecutive ids differ, no short cycle

Prompt = list[int] | str


def generated_prompt_ids(num_tokens: int) -> list[int]:
    if num_tokens < 1:
        raise UsageError(f"--prompt-tokens must be at least 1, got {num_tokens}")
    return [_ID_BASE + (i * _ID_STRIDE + 17) % _ID_SPAN for i in range(num_tokens)]


def parse_prompt_text(text: str) -> Prompt:
    """Token ids when the file holds a JSON list of ints or whitespace/comma separated ints;
    otherwise the text itself (the server tokenizes it; the same text gives the same ids)."""
    stripped = text.strip()
    if not stripped:
        raise UsageError("the prompt file is empty")
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except ValueError:
            value = None
        if isinstance(value, list) and value and all(type(v) is int for v in value):
            return _checked_ids(value)
    if re.fullmatch(r"[0-9]+([\s,]+[0-9]+)*", stripped):
        return _checked_ids([int(v) for v in re.split(r"[\s,]+", stripped)])
    return text


def _checked_ids(ids: list[int]) -> list[int]:
    if any(v < 0 for v in ids):
        raise UsageError("the prompt file holds a negative token id")
    return ids


def load_prompt(prompt_tokens: int | None, prompt_file: Path | None) -> tuple[Prompt, PromptInfo]:
    if prompt_tokens is not None and prompt_file is not None:
        raise UsageError("give either --prompt-tokens or --prompt-file, not both")
    if prompt_file is not None:
        try:
            text = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the prompt file {prompt_file}: {exc}") from None
        prompt = parse_prompt_text(text)
        return prompt, _info(prompt, prompt_file.name)
    prompt = generated_prompt_ids(prompt_tokens if prompt_tokens is not None else 128)
    return prompt, _info(prompt, "generated")


def _info(prompt: Prompt, source: str) -> PromptInfo:
    canonical = json.dumps(prompt, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    if isinstance(prompt, str):
        return PromptInfo(kind="text", source=source, num_tokens=None, sha256=digest)
    return PromptInfo(kind="token_ids", source=source, num_tokens=len(prompt), sha256=digest)
