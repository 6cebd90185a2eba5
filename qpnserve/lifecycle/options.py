"""The options of the lifecycle stages: what `up` is asked to start, and their checks.

Nothing here runs a stage; the stages before the start live in stages.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qpnserve import config
from qpnserve.errors import UsageError

Progress = Callable[[str], None]


def stderr_progress(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@dataclass
class UpOptions:
    """Everything `up` needs. ``detach``: return once ready instead of serving in the foreground."""

    model: Path
    awq_m1: bool = True
    include_plugin: bool = True  # False: leave qpnserve's plugin out (`rollback --unpatch`)
    tp: int = 4
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # None: the checkpoint directory's name
    detach: bool = False
    timeout_s: float = 1800.0  # 4x V100 loads take minutes; CUDA graph capture adds more
    stop_timeout_s: float = 60.0  # grace period of the group stop on failure or Ctrl-C
    extra_args: list[str] = field(default_factory=list)
    server_module: str = config.DEFAULT_SERVER_MODULE
    poll_s: float = 1.0
    progress_every_s: float = 10.0

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model.resolve().name


def validate(opts: UpOptions) -> None:
    if not opts.model.is_dir():
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
