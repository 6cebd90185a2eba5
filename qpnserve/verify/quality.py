"""Live verify's quality pair: the same fixed prompts, greedy, on the route-off and the route-on
server; identical output token streams counted, and for each stream that is not identical, the
first divergent index and the top-2 logprobs of both servers there (a divergence at an exact or
near tie of the top two is rounding, not a wrong route; the origin saw 47 of 65 identical, the
first divergence at an exact logit tie). Information beside the numerics: it never decides the
exit code.

The requests ask for token ids in the logprobs (vLLM's ``return_tokens_as_token_ids``); a server
that returns no logprobs is compared on its text, and the report says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from qpnserve.errors import ServerError

QUALITY_TOKENS = 32
TOP = 2


@dataclass(frozen=True)
class Stream:
    tokens: list[str]  # token ids as vLLM prints them ("token_id:123"), or [text] without logprobs
    top: list[list[tuple[str, float]]] | None  # per position: the top-2 (token, logprob)


@dataclass(frozen=True)
class Divergence:
    prompt: int
    index: int  # first position where the two streams differ
    route_off_top2: list[tuple[str, float]] | None
    route_on_top2: list[tuple[str, float]] | None


@dataclass
class QualityPair:
    prompts: int = 0
    identical: int = 0
    with_logprobs: bool = True
    divergences: list[Divergence] = field(default_factory=list)

    def line(self) -> str:
        text = f"quality pair: {self.identical} of {self.prompts} greedy output streams identical"
        if not self.with_logprobs:
            text += " (the server returned no logprobs: compared as text)"
        for d in self.divergences:
            text += (
                f"; prompt {d.prompt} first differs at token {d.index} "
                f"(top-2 off {d.route_off_top2}, on {d.route_on_top2})"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def request_body(model: str, prompt: tuple[int, ...]) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": QUALITY_TOKENS,
        "temperature": 0,
        "logprobs": TOP,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
    }


def parse_stream(response: dict[str, Any]) -> Stream:
    try:
        choice = response["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ServerError("quality pair: the server's answer has no choices") from None
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens")
    if not tokens:
        return Stream(tokens=[str(choice.get("text", ""))], top=None)
    tops = logprobs.get("top_logprobs") or []
    top = [sorted((t or {}).items(), key=lambda kv: -kv[1])[:TOP] for t in tops]
    return Stream(tokens=[str(t) for t in tokens], top=top)


def compare(route_off: list[Stream], route_on: list[Stream]) -> QualityPair:
    pair = QualityPair(prompts=len(route_on))
    for prompt, (off, on) in enumerate(zip(route_off, route_on, strict=True)):
        pair.with_logprobs &= off.top is not None and on.top is not None
        if off.tokens == on.tokens:
            pair.identical += 1
            continue
        index = next(
            (i for i, (a, b) in enumerate(zip(off.tokens, on.tokens, strict=False)) if a != b),
            min(len(off.tokens), len(on.tokens)),
        )

        def top2(stream: Stream, i: int = index) -> list[tuple[str, float]] | None:
            return stream.top[i] if stream.top is not None and i < len(stream.top) else None

        pair.divergences.append(Divergence(prompt, index, top2(off), top2(on)))
    return pair


def send(base_url: str, model: str, prompt: tuple[int, ...], timeout_s: float) -> Stream:
    import httpx

    try:
        response = httpx.post(
            f"{base_url}/v1/completions", json=request_body(model, prompt), timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        raise ServerError(f"quality pair: the request failed: {exc}") from None
    if response.status_code != 200:
        raise ServerError(f"quality pair: the server answered {response.status_code}")
    return parse_stream(response.json())
