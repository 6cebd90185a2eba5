"""The benchmark's data: raw stream records (client output) and the pydantic report models.

Times in raw records are client perf_counter seconds; everything in a report is relative
(milliseconds for latencies, seconds for windows and durations) so reports from different
runs and hosts compare directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1


@dataclass
class StreamRecord:
    """What the client saw of one streamed completion request (all times perf_counter s)."""

    sent_at_s: float
    max_tokens: int
    # One entry per chunk that carried at least one token, in arrival order.
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # tokens carried by each chunk
    chunk_texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage_completion_tokens: int | None = None  # the server's own count, when it sent usage
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    done_at_s: float | None = None
    error: str | None = None  # set when the stream broke (connection lost, HTTP error)
    http_status: int | None = None  # set when the server refused the request

    @property
    def tokens_received(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return sum(self.chunk_tokens)


class PromptInfo(BaseModel):
    kind: Literal["token_ids", "text"]
    source: str  # "generated" or the file name it was read from
    num_tokens: int | None  # known for token ids; for text the server's usage says
    sha256: str  # of the exact prompt sent, so two reports can prove they used the same one


class Settings(BaseModel):
    concurrency: list[int]
    output_tokens: int
    warmup_waves: int  # per cell, at the cell's concurrency, never scored
    rounds: int  # scored waves per cell
    temperature: float = 0.0
    ignore_eos: bool = True
    request_timeout_s: float
    prompt: PromptInfo


class ServerInfo(BaseModel):
    url: str
    model: str
    version: str | None = None  # GET /version, when the server has it
    max_model_len: int | None = None
    # What the server said about prefix caching (vLLM's cache_config_info metric), if anything.
    prefix_caching: str | None = None
    cached_prompt_tokens: int | None = None  # summed over scored requests, when usage reports it
    route: str | None = None  # set by `bench ab`: the route flag and what the ranks reported
    # Whether the server speculates, by its own /metrics (vLLM registers the spec_decode
    # counters only then; None: it could not tell), and qpnserve.speculation's line about it.
    speculating: bool | None = None
    speculation: str | None = None


class ClientInfo(BaseModel):
    hostname: str
    platform: str
    python: str
    cpu_count: int | None


class RequestResult(BaseModel):
    wave: int
    ttft_ms: float | None
    tokens_received: int
    decode_tok_s: float | None  # tokens after the first / (last arrival - first arrival)
    itls_ms: list[float]
    finish_reason: str | None
    error: str | None = None


class Window(BaseModel):
    """One wave's decode window: after the LAST first token, up to the FIRST finish."""

    start_s: float  # relative to the wave's first send
    end_s: float
    tokens: float  # tokens in (start_s, end_s], interpolated between arrivals (summarize.py)

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


class CellResult(BaseModel):
    concurrency: int
    requests: int
    completed: int
    failed: int
    total_output_tokens: int
    duration_s: float  # sum over waves of first send to last finish
    output_tok_s: float | None  # all tokens / duration (prefill and tails included)
    window_s: float | None  # sum of the waves' decode-window lengths
    window_tokens: float | None
    pure_decode_tok_s: float | None  # window_tokens / window_s (contract section 6)
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    median_itl_ms: float | None
    p90_itl_ms: float | None
    mean_decode_tok_s_per_request: float | None
    windows: list[Window | None]
    window_note: str | None = None  # why there is no pure figure (a wave without a window)
    per_request: list[RequestResult]
    # From the server's /metrics just before and after the scored waves (bench/steps.py): the
    # share of engine steps that processed exactly one token, the only steps the M=1 route
    # serves. None with single_token_step_reason when the server has no such metric.
    single_token_step_share: float | None = None
    single_token_step_reason: str | None = None
    engine_steps: int | None = None
    single_token_steps: int | None = None
    # Speculative decoding's counters over the same stretch; None: the server does not speculate.
    draft_tokens: int | None = None
    accepted_draft_tokens: int | None = None
    draft_acceptance_rate: float | None = None


class CanaryResult(BaseModel):
    # True only when at least one stream was examined and none failed: a canary that examined
    # nothing (every stream broke first) is not a pass (note says so).
    passed: bool
    checked_streams: int
    failures: list[str] = Field(default_factory=list)
    note: str | None = None


class BenchReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: Literal["qpnserve.bench.smoke"] = "qpnserve.bench.smoke"
    label: str | None = None  # e.g. "route-off" / "route-on" in `bench ab`
    started_at: str  # ISO 8601, UTC
    finished_at: str | None = None
    qpnserve_version: str
    server: ServerInfo
    client: ClientInfo
    settings: Settings
    cells: list[CellResult] = Field(default_factory=list)
    canary: CanaryResult
    complete: bool = False  # False: a partial report (the run stopped early; see error)
    error: str | None = None
