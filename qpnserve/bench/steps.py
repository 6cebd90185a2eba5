"""How many engine steps processed exactly one token: the steps the AWQ M1 route can serve.

vLLM counts the tokens of every engine step in the histogram ``vllm:iteration_tokens_total``
(prompt tokens computed plus tokens generated); its ``le="1"`` bucket counts the steps that
processed one token, which without speculation is a decode step of one request. The route
serves only those steps (its MoE layers see one row), so the share of single-token steps says
how often it can fire on the traffic measured. With speculation a verify step whose drafts were
all rejected also generated one token and lands in that bucket although it ran k+1 rows (the
route fires on none of them anyway); vLLM then also counts
``vllm:spec_decode_num_draft_tokens`` and ``..._num_accepted_tokens``, whose ratio is the draft
acceptance rate.

Counters are cumulative since the server started: a figure for a stretch of traffic is the
difference of two scrapes (``delta``); ``since_start`` reads one scrape as it is. Parsing is
prometheus_client's (the exposition format has escaping and several sample kinds; vLLM
depends on that library itself). Pure but for ``scrape``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

STEPS_METRIC = "vllm:iteration_tokens_total"
DRAFT_METRIC = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_METRIC = "vllm:spec_decode_num_accepted_tokens"
_SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StepCounters:
    """One scrape's cumulative counts, summed over engines; None where the server has none."""

    steps: float | None  # engine steps (the histogram's count)
    single_token_steps: float | None  # steps that processed exactly one token
    draft_tokens: float | None  # None: no speculation counters (speculation off)
    accepted_tokens: float | None
    missing: str | None = None  # why steps or single_token_steps is None


@dataclass(frozen=True)
class StepShare:
    """Steps over a stretch of traffic: the share, or None and the reason there is none."""

    engine_steps: int | None
    single_token_steps: int | None
    share: float | None  # single_token_steps / engine_steps, 0..1
    reason: str | None  # why share is None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_rate: float | None = None  # accepted / draft, when drafts were made

    @property
    def speculating(self) -> bool:
        return self.draft_tokens is not None


def parse_counters(metrics_text: str) -> StepCounters:
    """Read the step histogram and the speculation counters from a /metrics body."""
    from prometheus_client.parser import text_string_to_metric_families

    count = single = draft = accepted = None
    le_one_seen = False
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name == STEPS_METRIC + "_count":
                    count = (count or 0.0) + sample.value
                elif sample.name == STEPS_METRIC + "_bucket" and _is_one(sample.labels.get("le")):
                    le_one_seen = True
                    single = (single or 0.0) + sample.value
                elif sample.name == DRAFT_METRIC + "_total":
                    draft = (draft or 0.0) + sample.value
                elif sample.name == ACCEPTED_METRIC + "_total":
                    accepted = (accepted or 0.0) + sample.value
    except ValueError as exc:
        return StepCounters(None, None, None, None, f"its /metrics is not Prometheus text ({exc})")
    missing = None
    if count is None:
        missing = (
            f"the server exports no {STEPS_METRIC} histogram (not vLLM, or a build without it)"
        )
    elif not le_one_seen:
        missing = f'the server\'s {STEPS_METRIC} has no le="1" bucket (custom buckets)'
        count = None
    return StepCounters(count, single, draft, accepted, missing)


def _is_one(le: str | None) -> bool:
    try:
        return le is not None and float(le) == 1.0
    except ValueError:
        return False


def delta(before: StepCounters | str, after: StepCounters | str) -> StepShare:
    """The share over the traffic between two scrapes. A str is why that scrape failed."""
    for scrape in (before, after):
        if isinstance(scrape, str):
            return StepShare(None, None, None, scrape)
    assert isinstance(before, StepCounters) and isinstance(after, StepCounters)
    if before.missing or after.missing:
        return StepShare(None, None, None, before.missing or after.missing)
    steps = _diff(before.steps, after.steps)
    single = _diff(before.single_token_steps, after.single_token_steps)
    draft = _diff(before.draft_tokens, after.draft_tokens)
    accepted = _diff(before.accepted_tokens, after.accepted_tokens)
    if steps is None or single is None or steps < 0 or single < 0:
        return StepShare(
            None,
            None,
            None,
            "the server's step counters went backwards (did it restart during the cell?)",
        )
    return _share(steps, single, draft, accepted, "while the cell ran")


def since_start(counters: StepCounters | str) -> StepShare:
    """The share over everything the server ran since it started."""
    if isinstance(counters, str):
        return StepShare(None, None, None, counters)
    if counters.missing or counters.steps is None or counters.single_token_steps is None:
        return StepShare(None, None, None, counters.missing)
    return _share(
        round(counters.steps),
        round(counters.single_token_steps),
        _whole(counters.draft_tokens),
        _whole(counters.accepted_tokens),
        "since the server started",
    )


def _diff(before: float | None, after: float | None) -> int | None:
    return None if before is None or after is None else round(after - before)


def _whole(value: float | None) -> int | None:
    return None if value is None else round(value)


def _share(
    steps: int, single: int, draft: int | None, accepted: int | None, when: str
) -> StepShare:
    rate = accepted / draft if draft and accepted is not None else None
    if steps == 0:  # a share of nothing is not a measurement
        return StepShare(0, 0, None, f"no engine step was counted {when}", draft, accepted, rate)
    return StepShare(steps, single, single / steps, None, draft, accepted, rate)


async def scrape(client: httpx.AsyncClient, url: str) -> StepCounters | str:
    """GET /metrics and parse it; a str says why there is nothing to parse."""
    import httpx

    try:
        response = await client.get(url + "/metrics", timeout=_SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"the server's /metrics did not answer ({type(exc).__name__})"
    if response.status_code != 200:
        return f"the server's /metrics answered HTTP {response.status_code}"
    return parse_counters(response.text)


def scrape_now(url: str, timeout_s: float) -> StepCounters | str:
    """The blocking twin of ``scrape``, for `status`."""
    import httpx

    try:
        response = httpx.get(url + "/metrics", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"the server's /metrics did not answer ({type(exc).__name__})"
    if response.status_code != 200:
        return f"the server's /metrics answered HTTP {response.status_code}"
    return parse_counters(response.text)


def share_text(share: StepShare, when: str = "") -> str:
    """One line: the share in words, and the acceptance rate when the server speculates.
    ``when`` (e.g. " since the server started") qualifies the counts."""
    if share.share is None:
        text = f"single-token step share: none ({share.reason})"
    else:
        text = (
            f"single-token step share {share.share:.2f} "
            f"({share.single_token_steps} of {share.engine_steps} engine steps{when})"
        )
    if share.speculating:
        text += "; " + acceptance_text(share)
    return text


def acceptance_text(share: StepShare) -> str:
    if share.acceptance_rate is None:
        return f"draft acceptance: no draft tokens ({share.draft_tokens or 0} proposed)"
    return acceptance_figure(share.acceptance_rate, share.accepted_tokens, share.draft_tokens)


def acceptance_figure(rate: float, accepted: float | None, proposed: float | None) -> str:
    """Speculation's own figure, the same words in `status` and the bench table."""
    return f"draft acceptance {rate:.2f} ({accepted} of {proposed} draft tokens)"
