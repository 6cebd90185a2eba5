"""The options of the lifecycle stages: what `up` is asked to start, their checks, and the
defaults they take from the desired state (the route the last `up` or `rollback` chose).

Nothing here runs a stage; the stages before the start live in stages.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from qpnserve import config
from qpnserve.errors import UsageError
from qpnserve.server_spec import ServerSpec
from qpnserve.state import DesiredState, read_desired

Progress = Callable[[str], None]


def stderr_progress(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class UpOptions(ServerSpec):
    """Everything `up` needs: the server's spec, and how to start it. ``detach``: return once
    ready instead of serving in the foreground."""

    # A misspelt option is an error (as when this was a dataclass), never silently dropped;
    # the state files keep pydantic's default and ignore keys they do not know.
    model_config = ConfigDict(extra="forbid")

    model: str  # `up` always names the checkpoint (options_from_desired says when it cannot)
    detach: bool = False
    timeout_s: float = config.DEFAULT_UP_TIMEOUT_S
    stop_timeout_s: float = config.DEFAULT_STOP_TIMEOUT_S  # also on failure or Ctrl-C
    poll_s: float = 1.0
    progress_every_s: float = 10.0
    # The server's API key, given as `-- --api-key K` (taken out of extra_args here, so no argv,
    # state file or log of qpnserve's holds it); None: the server inherits $VLLM_API_KEY, if set.
    api_key: str | None = Field(default=None, repr=False, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _take_api_key(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("extra_args"):
            return data
        from qpnserve.auth import split_api_key

        extra_args, key = split_api_key(data["extra_args"])
        given = data.get("api_key")
        if key is not None and given is not None and given != key:
            raise UsageError("two different API keys were given")
        return data | {"extra_args": extra_args, "api_key": key if key is not None else given}


def validate(opts: UpOptions) -> None:
    if not opts.model_dir.is_dir():
        raise UsageError(f"--model {opts.model} is not a directory", hint="pass the checkpoint dir")
    if opts.tp < 1:
        raise UsageError(f"--tp must be at least 1, got {opts.tp}")
    if not 1 <= opts.port <= 65535:
        raise UsageError(f"--port must be 1..65535, got {opts.port}")
    if opts.timeout_s <= 0:
        raise UsageError(f"--timeout-s must be positive, got {opts.timeout_s}")
    if opts.awq_m1 and not opts.include_plugin:
        raise UsageError(
            "the route needs qpnserve's plugin: it applies the dispatch and writes the proof",
            hint="drop --unpatch, or start with --no-awq-m1",
        )


def resolve_up_options(
    *, model: Path | None, awq_m1: bool | None, settings: config.Settings, **fields: Any
) -> tuple[UpOptions, str | None]:
    """`up`'s options from what the user passed, filled from the desired state (what the last
    `up` or `rollback` recorded). ``awq_m1`` None: the desired route, else on. Returns the
    options and, when the route came from the desired state, a line that says so."""
    root = settings.state_dir
    desired = read_desired(root) if root.is_dir() else None
    return options_from_desired(desired, model=model, awq_m1=awq_m1, **fields)


def options_from_desired(
    desired: DesiredState | None, *, model: Path | None, awq_m1: bool | None, **fields: Any
) -> tuple[UpOptions, str | None]:
    model = model or (Path(desired.model) if desired and desired.model else None)
    if model is None:
        raise UsageError(
            "--model is required", hint=f"pass --model PATH or set {config.MODEL.name}"
        )
    route: dict[str, Any] = {}  # left out: the spec's default
    if desired is not None:
        route = {"awq_m1": desired.awq_m1, "include_plugin": desired.include_plugin}
    if awq_m1 is not None:
        route["awq_m1"] = awq_m1
    if awq_m1:  # an explicit --awq-m1 brings the plugin back after `rollback --unpatch`
        route.pop("include_plugin", None)
    opts = UpOptions(model=str(model), **route, **fields)
    note = None
    if awq_m1 is None and desired is not None:
        on = "on" if opts.awq_m1 else "off"
        note = f"route: {on} (desired state; --awq-m1/--no-awq-m1 sets it)"
    return opts, note
