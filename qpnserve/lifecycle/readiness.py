"""Wait until a started server really serves: `/health` 200, the model listed by `/v1/models`,
and one real one-token completion. A server can answer `/health` before it can generate, so
only the completion proves the engine works.

While waiting: the process must stay alive (else the caller gets its log tail), progress goes
to a callback (elapsed, what it waits for, the log's last line), and the deadline is hard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qpnserve.auth import auth_headers, unauthorized_hint, unauthorized_text
from qpnserve.errors import ServerError
from qpnserve.lifecycle.procs import log_tail

if TYPE_CHECKING:
    import httpx

LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class Probe:
    """One readiness step: ``ok`` once it passed; ``detail`` says what was seen."""

    ok: bool
    detail: str
    unauthorized: bool = False  # HTTP 401: a key problem, which no amount of waiting fixes


def probe_health(client: httpx.Client, base_url: str) -> Probe:
    import httpx

    try:
        resp = client.get(f"{base_url}/health")
    except httpx.HTTPError as exc:
        return Probe(False, f"no answer ({type(exc).__name__})")
    return Probe(resp.status_code == 200, f"HTTP {resp.status_code}")


def probe_models(client: httpx.Client, base_url: str, served_model_name: str) -> Probe:
    import httpx

    try:
        resp = client.get(f"{base_url}/v1/models")
        ids = [m.get("id") for m in resp.json().get("data", [])] if resp.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return Probe(False, f"no model list ({type(exc).__name__})")
    if resp.status_code == 401:
        return Probe(False, "HTTP 401", unauthorized=True)
    if served_model_name in ids:
        return Probe(True, f"{served_model_name} listed")
    return Probe(False, f"HTTP {resp.status_code}, models {ids}")


def probe_completion(client: httpx.Client, base_url: str, served_model_name: str) -> Probe:
    import httpx

    body = {"model": served_model_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    try:
        resp = client.post(f"{base_url}/v1/completions", json=body)
        choices = resp.json().get("choices") if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return Probe(False, f"completion failed ({type(exc).__name__})")
    if resp.status_code == 401:
        return Probe(False, "completion HTTP 401", unauthorized=True)
    if choices:
        return Probe(True, "one-token completion answered")
    return Probe(False, f"completion HTTP {resp.status_code}")


STEPS = ("/health", "/v1/models", "a one-token completion")


def wait_ready(
    *,
    base_url: str,
    served_model_name: str,
    exit_code: Callable[[], int | None],
    log_path: Path,
    timeout_s: float,
    poll_s: float = 1.0,
    progress_every_s: float = 10.0,
    progress: Callable[[str], None] | None = None,
    api_key: str | None = None,
) -> None:
    """Return once all three steps pass; raise ServerError if the process exits, time runs out,
    or the server answers 401 (with ``api_key``, or without one: a key problem, not a slow load).

    ``exit_code`` returns the server's exit status once it has exited (Popen.poll).
    """
    import httpx

    started = time.monotonic()
    last_progress = started
    step = 0
    attempt = 0
    detail = "not tried yet"
    # A first completion on a real server may be slow (warm-up), but never longer than the budget.
    timeout = httpx.Timeout(min(60.0, max(timeout_s, 1.0)), connect=2.0)
    with httpx.Client(timeout=timeout, headers=auth_headers(api_key)) as client:
        while True:
            code = exit_code()
            if code is not None:
                raise ServerError(_died_message(code, time.monotonic() - started, log_path))
            if step == 0:
                probe = probe_health(client, base_url)
            elif step == 1:
                probe = probe_models(client, base_url, served_model_name)
            else:
                probe = probe_completion(client, base_url, served_model_name)
            detail = probe.detail
            if probe.unauthorized:
                raise ServerError(
                    unauthorized_text(api_key, f"the server at {base_url}"),
                    hint=unauthorized_hint(),
                )
            if probe.ok:
                step += 1
                if step == len(STEPS):
                    return
                continue
            elapsed_s = time.monotonic() - started
            if elapsed_s >= timeout_s:
                raise ServerError(
                    f"the server was not ready after {timeout_s:.0f} s: waiting for "
                    f"{STEPS[step]} at {base_url} ({detail})" + _tail_text(log_path),
                    hint="raise --timeout-s if the model is still loading, or read the log: "
                    f"{log_path}",
                )
            if progress and time.monotonic() - last_progress >= progress_every_s:
                last_progress = time.monotonic()
                last = log_tail(log_path, 1)
                progress(
                    f"waiting {elapsed_s:.0f}/{timeout_s:.0f} s for {STEPS[step]} ({detail})"
                    + (f"; log: {last[0][:160]}" if last else "")
                )
            # Quick first polls (a small server is up in well under a second), backing off to
            # poll_s for a model that loads for minutes.
            attempt += 1
            pause_s = min(poll_s, 0.05 * 1.5**attempt)
            time.sleep(min(pause_s, max(0.0, timeout_s - elapsed_s)))


def _tail_text(log_path: Path) -> str:
    tail = log_tail(log_path, LOG_TAIL_LINES)
    if not tail:
        return f"; the log {log_path} is empty"
    return f"; last {len(tail)} log lines:\n" + "\n".join(f"  | {line}" for line in tail)


def _died_message(code: int, elapsed_s: float, log_path: Path) -> str:
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return f"the server {how} after {elapsed_s:.0f} s, before it was ready" + _tail_text(log_path)
