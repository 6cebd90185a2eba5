"""A stand-in OpenAI-compatible completions server for tests. It is NOT vLLM and says so.

Kept beside the real-vLLM suite (tests/e2e) for what vLLM cannot do on demand: exact timing
(so the metrics can be checked against known values), and misbehaviour (empty, truncated or
degenerate streams, a server that drops the connection mid-run).

Plain ASGI (no framework), served by uvicorn. It streams deterministic tokens with controlled
timing and can misbehave on purpose, so the benchmark client and the lifecycle stages can be
tested against a real HTTP server process without a GPU.

Endpoints: GET /health, GET /v1/models, GET /version, POST /v1/completions (stream or not),
and GET /metrics when ``metrics`` is on (else 404, like a server that is not vLLM).

/metrics holds vLLM's step histogram ``vllm:iteration_tokens_total`` (its le="1" bucket and
count) and, when ``draft_tokens_per_request`` >= 0, the speculation counters. The counts are
scripted, not simulated: every completion request adds ``steps_per_request`` steps, of which
``single_token_steps_per_request`` single-token ones (and its draft/accepted tokens), just
before its last event, as vLLM records a step before it releases the step's tokens. So a
test knows exactly what any stretch of requests must read.

Timing of one completion request (times from the moment its body has arrived):
    token j (0-based) is sent at
        first_token_delay_s + k * first_token_step_s + j * inter_token_interval_s
where k is the number of completion requests already in flight when it arrived. So C requests
sent together get first tokens staggered by first_token_step_s, in arrival order; a request
sent alone (a warm-up, a C1 run) always has k = 0. Deadlines are absolute (no drift).

Failure modes (``failure``), applied to completion requests whose 0-based arrival index is
>= ``failure_from_request`` (so warm-ups and early requests can stay healthy):
    none        every stream delivers max_tokens distinct tokens
    empty       no token at all, then a clean end (usage says 0 completion tokens)
    truncated   failure_after_tokens tokens, then a clean end with finish_reason "stop"
    degenerate  max_tokens tokens, all the same text
    close       failure_after_tokens tokens, then the connection is dropped mid-body
    exit        failure_after_tokens tokens, then the whole server process exits (code 3)

Use from tests:
    with run_fake_server(FakeServerConfig(inter_token_interval_s=0.01)) as base_url: ...
or from the command line (every config field is a flag, dashes for underscores):
    python -m tests.support.fake_server --port 0 --port-file /tmp/p --inter-token-interval-s 0.01
Extending (the lifecycle stand-in does): subclass FakeServerConfig (a dataclass with defaults),
call make_app(config), flip ``app.ready`` while "loading" (health and API answer 503), and
serve it with serve(app, host, port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAILURE_MODES = ("none", "empty", "truncated", "degenerate", "close", "exit")
SERVER_VERSION = "fake-test-server"  # honest name: never claims to be vLLM
EXIT_CODE_ON_EXIT_FAILURE = 3

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class FakeServerConfig:
    model_name: str = "fake-model"
    server_version: str = SERVER_VERSION
    max_model_len: int = 4096
    first_token_delay_s: float = 0.0
    first_token_step_s: float = 0.0
    inter_token_interval_s: float = 0.0
    failure: str = "none"
    failure_from_request: int = 0
    failure_after_tokens: int = 0
    metrics: bool = False
    steps_per_request: int = 0
    single_token_steps_per_request: int = 0
    draft_tokens_per_request: int = -1  # -1: no speculation counters at all
    accepted_tokens_per_request: int = 0

    def __post_init__(self) -> None:
        if self.failure not in FAILURE_MODES:
            raise ValueError(f"failure must be one of {FAILURE_MODES}, got {self.failure!r}")


def token_text(index: int) -> str:
    """The deterministic text of token ``index`` of every healthy stream (all distinct)."""
    return f" t{index}"


DEGENERATE_TEXT = " the"


class _DropConnection(Exception):
    """Raised inside the app after the body started: uvicorn then aborts the connection."""


class FakeOpenAIServer:
    """The ASGI app. Attributes tests may read or flip: ready, requests_started, in_flight."""

    def __init__(self, config: FakeServerConfig) -> None:
        self.config = config
        self.ready = True
        self.requests_started = 0
        self.in_flight = 0
        self.created_s = int(time.time())
        self.counted_requests = 0  # requests whose scripted step counts /metrics includes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path == "/health" and method == "GET":
            await _send_bytes(send, 200 if self.ready else 503, b"", "text/plain")
        elif path == "/metrics" and method == "GET" and self.config.metrics:
            await _send_bytes(send, 200, self._metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/version" and method == "GET":
            await _send_json(send, 200, {"version": self.config.server_version})
        elif not self.ready and path.startswith("/v1/"):
            await _send_error(send, 503, "server is loading")
        elif path == "/v1/models" and method == "GET":
            await _send_json(send, 200, self._models())
        elif path == "/v1/completions" and method == "POST":
            await self._completions(receive, send)
        else:
            await _send_error(send, 404, f"no route {method} {path}")

    def _metrics(self) -> str:
        c, n = self.config, self.counted_requests
        steps, single = n * c.steps_per_request, n * c.single_token_steps_per_request
        name = "vllm:iteration_tokens_total"
        labels = f'engine="0",model_name="{c.model_name}"'
        lines = [
            f"# HELP {name} Histogram of number of tokens per engine_step.",
            f"# TYPE {name} histogram",
            f"{name}_sum{{{labels}}} {float(steps * 2)}",
            f'{name}_bucket{{{labels},le="1.0"}} {float(single)}',
            f'{name}_bucket{{{labels},le="8.0"}} {float(steps)}',
            f'{name}_bucket{{{labels},le="+Inf"}} {float(steps)}',
            f"{name}_count{{{labels}}} {float(steps)}",
        ]
        if c.draft_tokens_per_request >= 0:
            for what, per_request in (
                ("draft", c.draft_tokens_per_request),
                ("accepted", c.accepted_tokens_per_request),
            ):
                counter = f"vllm:spec_decode_num_{what}_tokens"
                lines += [
                    f"# TYPE {counter} counter",
                    f"{counter}_total{{{labels}}} {float(n * per_request)}",
                ]
        return "\n".join(lines) + "\n"

    def _models(self) -> dict[str, Any]:
        model = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created_s,
            "owned_by": SERVER_VERSION,
            "root": self.config.model_name,
            "max_model_len": self.config.max_model_len,
        }
        return {"object": "list", "data": [model]}

    async def _completions(self, receive: Receive, send: Send) -> None:
        try:
            body = json.loads(await _read_body(receive) or b"{}")
        except ValueError:
            await _send_error(send, 400, "request body is not JSON")
            return
        if body.get("model", self.config.model_name) != self.config.model_name:
            await _send_error(send, 404, f"The model `{body.get('model')}` does not exist.")
            return
        max_tokens = int(body.get("max_tokens") or 16)
        if max_tokens < 1:
            await _send_error(send, 400, "max_tokens must be at least 1")
            return
        request_index = self.requests_started
        self.requests_started += 1
        stagger_slot = self.in_flight
        self.in_flight += 1
        try:
            plan = _plan(self.config, request_index, max_tokens)
            start_s = asyncio.get_running_loop().time()
            first_s = start_s + self.config.first_token_delay_s
            first_s += stagger_slot * self.config.first_token_step_s
            request = _Request(
                id=f"cmpl-fake-{request_index}",
                created_s=int(time.time()),
                model=self.config.model_name,
                prompt_tokens=_count_prompt_tokens(body.get("prompt")),
                first_token_at_s=first_s,
                interval_s=self.config.inter_token_interval_s,
            )
            if body.get("stream"):
                options = body.get("stream_options") or {}
                usage_mode = "every" if options.get("continuous_usage_stats") else "last"
                usage_mode = usage_mode if options.get("include_usage") else "none"
                await _stream(send, request, plan, usage_mode, self._count_steps)
            else:
                self._count_steps()
                await _complete(send, request, plan)
        finally:
            self.in_flight -= 1

    def _count_steps(self) -> None:
        self.counted_requests += 1


@dataclass(frozen=True)
class _Plan:
    texts: tuple[str, ...]  # the tokens to send, in order
    finish_reason: str
    then: str  # "end" (clean), "close" (drop connection) or "exit" (kill the process)


@dataclass(frozen=True)
class _Request:
    id: str
    created_s: int
    model: str
    prompt_tokens: int
    first_token_at_s: float  # event-loop clock
    interval_s: float


def _plan(config: FakeServerConfig, request_index: int, max_tokens: int) -> _Plan:
    healthy = tuple(token_text(j) for j in range(max_tokens))
    mode = config.failure if request_index >= config.failure_from_request else "none"
    cut = min(config.failure_after_tokens, max_tokens)
    if mode == "empty":
        return _Plan((), "stop", "end")
    if mode == "truncated":
        return _Plan(healthy[: min(cut, max_tokens - 1)], "stop", "end")
    if mode == "degenerate":
        return _Plan((DEGENERATE_TEXT,) * max_tokens, "length", "end")
    if mode in ("close", "exit"):
        return _Plan(healthy[:cut], "length", mode)
    return _Plan(healthy, "length", "end")


def _count_prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of id lists: this stand-in answers the first only
    if isinstance(prompt, list):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    return 0


async def _stream(
    send: Send,
    request: _Request,
    plan: _Plan,
    usage_mode: str,
    before_last_event: Callable[[], None] = lambda: None,
) -> None:
    """usage_mode: "none", "last" (include_usage) or "every" (vLLM's continuous_usage_stats:
    cumulative usage in every chunk, which tells a client exactly how many tokens each carries)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )
    loop = asyncio.get_running_loop()
    last = len(plan.texts) - 1
    for j, text in enumerate(plan.texts):
        delay_s = request.first_token_at_s + j * request.interval_s - loop.time()
        # sleep(0) when due already: concurrent streams interleave like a batching server's
        await asyncio.sleep(max(delay_s, 0.0))
        finish = plan.finish_reason if (j == last and plan.then == "end") else None
        usage = _usage(request, j + 1) if usage_mode == "every" else None
        await _send_event(send, _chunk(request, [_choice(text, finish)], usage))
    if plan.then == "close":
        raise _DropConnection("dropping the connection on purpose")
    if plan.then == "exit":
        await asyncio.sleep(0.05)  # let the transport flush what was sent, then die
        os._exit(EXIT_CODE_ON_EXIT_FAILURE)
    if not plan.texts:
        usage = _usage(request, 0) if usage_mode == "every" else None
        await _send_event(send, _chunk(request, [_choice("", plan.finish_reason)], usage))
    before_last_event()
    if usage_mode != "none":
        await _send_event(send, _chunk(request, [], _usage(request, len(plan.texts))))
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _complete(send: Send, request: _Request, plan: _Plan) -> None:
    loop = asyncio.get_running_loop()
    done_s = request.first_token_at_s + max(len(plan.texts) - 1, 0) * request.interval_s
    if done_s > loop.time():
        await asyncio.sleep(done_s - loop.time())
    if plan.then == "exit":
        os._exit(EXIT_CODE_ON_EXIT_FAILURE)
    if plan.then == "close":
        raise _DropConnection("dropping the connection on purpose")
    choice = _choice("".join(plan.texts), plan.finish_reason)
    payload = _chunk(request, [choice], _usage(request, len(plan.texts)))
    await _send_json(send, 200, payload)


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _usage(request: _Request, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": request.prompt_tokens + completion_tokens,
    }


def _chunk(request: _Request, choices: list[Any], usage: Any) -> dict[str, Any]:
    return {
        "id": request.id,
        "object": "text_completion",
        "created": request.created_s,
        "model": request.model,
        "choices": choices,
        "usage": usage,
    }


async def _send_event(send: Send, payload: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _send_bytes(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Send, status: int, payload: Any) -> None:
    await _send_bytes(send, status, json.dumps(payload).encode(), "application/json")


async def _send_error(send: Send, status: int, text: str) -> None:
    error = {"message": text, "type": "fake_server_error", "code": status}
    await _send_json(send, status, {"error": error, "object": "error"})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def make_app(config: FakeServerConfig | None = None) -> FakeOpenAIServer:
    return FakeOpenAIServer(config or FakeServerConfig())


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back with getsockname)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(app: Any, host: str = "127.0.0.1", port: int = 0, port_file: Path | None = None) -> None:
    """Serve ``app`` with uvicorn on a socket bound here (so port 0 works and is reported)."""
    import uvicorn

    logging.getLogger("uvicorn.error").addFilter(_hide_planned_drops)
    sock = bind_socket(host, port)
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)  # atomic: a reader never sees a half-written port
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])


def _hide_planned_drops(record: logging.LogRecord) -> bool:
    """Keep uvicorn from printing a traceback for a connection this server drops on purpose."""
    return not (record.exc_info and isinstance(record.exc_info[1], _DropConnection))


def config_to_argv(config: FakeServerConfig) -> list[str]:
    argv: list[str] = []
    for field in dataclasses.fields(config):
        argv += [f"--{field.name.replace('_', '-')}", str(getattr(config, field.name))]
    return argv


def parse_args(
    argv: list[str] | None = None, config_cls: type[FakeServerConfig] = FakeServerConfig
) -> tuple[FakeServerConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description="Stand-in OpenAI-compatible server (not vLLM).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, default=None)
    defaults = config_cls()
    for field in dataclasses.fields(config_cls):
        default = getattr(defaults, field.name)
        kind = _parse_bool if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=default)
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_cls)}
    return config_cls(**values), args


def _parse_bool(text: str) -> bool:
    if text not in ("True", "False", "1", "0", "true", "false"):
        raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")
    return text in ("True", "1", "true")


def main(argv: list[str] | None = None) -> None:
    config, args = parse_args(argv)
    serve(make_app(config), args.host, args.port, args.port_file)


REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def run_fake_server(
    config: FakeServerConfig | None = None, startup_timeout_s: float = 20.0
) -> Iterator[str]:
    """Start the server as a separate process on a free 127.0.0.1 port; yield its base URL.

    The process (and its group) is always killed on exit, whatever happened inside.
    """
    import httpx

    argv = config_to_argv(config or FakeServerConfig())
    with tempfile.TemporaryDirectory(prefix="qpn-fake-") as tmp:
        port_file = Path(tmp) / "port"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        cmd = [sys.executable, "-m", "tests.support.fake_server", "--port-file", str(port_file)]
        proc = subprocess.Popen(cmd + argv, env=env, cwd=REPO_ROOT, start_new_session=True)
        try:
            base_url = _wait_ready(proc, port_file, startup_timeout_s, httpx)
            yield base_url
        finally:
            _kill_group(proc)


def _wait_ready(
    proc: subprocess.Popen[bytes], port_file: Path, timeout_s: float, httpx: Any
) -> str:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"fake server exited early with code {proc.returncode}")
        if port_file.exists():
            base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base_url + "/health", timeout=1.0).status_code == 200:
                    return base_url
        time.sleep(0.05)
    raise RuntimeError(f"fake server not ready within {timeout_s} s")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


if __name__ == "__main__":
    main()
