"""The server's spec: which server `up` starts. Each fact of it is defined here once.

Three records carry the spec, each a subclass that adds what only it knows:

- ``lifecycle.UpOptions``: what `up` is asked to start, and how (deadlines, the API key);
- ``state.DesiredState``: what the next `up` starts, as the last `up` or `rollback` left it;
- ``state.RunningState``: the server `up` started, with its process, log and host.

They subclass rather than hold a ``spec`` field so that the state files stay flat, key for key
as they were written before this record existed (tests/test_old_state_files.py), and so that
``opts.tp``, ``desired.port`` and ``running.model`` read as they always did. The defaults are
config.py's (tests/test_defaults_once.py); the one check of a spec that is asked for is
``lifecycle.options.validate``, run before anything starts (a state file is never re-judged).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from qpnserve import config
from qpnserve.errors import UsageError


class ServerSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    # The AWQ M1 route, on unless asked off. The server's environment and the running state
    # write it as the flag's value (config.route_flag_value).
    awq_m1: bool = True
    include_plugin: bool = True  # False after `rollback --unpatch`: qpnserve's plugin stays out
    # The checkpoint directory. None only in a desired state that `rollback` wrote before any
    # `up`; the running state and `up`'s options always name one.
    model: str | None = None
    served_model_name: str | None = None  # None: the checkpoint directory's name
    tp: int = config.DEFAULT_TP
    host: str = config.DEFAULT_HOST  # the address the server binds
    port: int = config.DEFAULT_PORT
    extra_args: list[str] = Field(default_factory=list)  # the server's own args, after `--`
    server_module: str | None = None  # the Python module run as the server; None: the host's

    @field_validator("model", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        """A ``Path`` is accepted (what the CLI and library callers hold); the record keeps text."""
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @property
    def model_dir(self) -> Path:
        if self.model is None:
            raise UsageError("no model is recorded", hint="pass --model PATH")
        return Path(self.model)

    @property
    def served_name(self) -> str:
        """The name the server answers to."""
        return self.served_model_name or self.model_dir.resolve().name

    @property
    def module_to_run(self) -> str:
        return self.server_module or config.DEFAULT_SERVER_MODULE

    @property
    def base_url(self) -> str:
        """Where a local client reaches the server."""
        return f"http://{client_host(self.host)}:{self.port}"

    def spec_fields(self) -> dict[str, Any]:
        """The spec of this record, field by field: the base of another of the three records."""
        return {name: getattr(self, name) for name in ServerSpec.model_fields}


def client_host(host: str) -> str:
    """Where a local client connects to reach a server bound on ``host``."""
    if host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
