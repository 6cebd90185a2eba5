"""Desired and running state of the server, on disk under the state directory.

- ``desired.json``: what the operator asked for (route on/off, plugin in/out, model, TP, port,
  extra server args). `up` writes it; `rollback` flips the route off.
- ``server.json``: the server qpnserve started and believes is running (pid, process group,
  the process's kernel start time against pid reuse, exact argv, the environment that matters,
  host kind, patch id, extension build key, log path). Cleared by `down` and by a failed `up`.

Both records are a ``ServerSpec`` (qpnserve/server_spec.py, shared with `up`'s options) plus
what only they know; their files keep the keys and key order they always had.

Every write is atomic (fsutil) and every read-modify-write happens under ``state.lock`` (a
filelock), so two qpnserve commands cannot race. The directory is created with mode 0700
because the files name the model path and the server's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from qpnserve import config
from qpnserve.config import RouteFlagValue
from qpnserve.errors import ConflictError, StateError
from qpnserve.fsutil import atomic_write_text
from qpnserve.host import HostKind
from qpnserve.server_spec import ServerSpec

SCHEMA_VERSION = 1
DESIRED_FILE = "desired.json"
RUNNING_FILE = "server.json"
LOCK_FILE = "state.lock"
# Long enough to outlast another command's short critical section (record a start, mark a stop),
# short enough that a wedged holder is reported instead of hanging forever.
DEFAULT_LOCK_TIMEOUT_S = 30.0

Phase = Literal["starting", "ready", "stopping"]


def _now() -> datetime:
    return datetime.now(UTC)


class _StateRecord(ServerSpec):
    """What both state files hold: the spec, the format's version, whether a key was set."""

    schema_version: int = SCHEMA_VERSION
    # The server had an API key (never stored): a restart without one would serve openly.
    api_key_set: bool = False


def _in_file_order(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``data`` with ``keys`` first, in that order. Pydantic lists a base's fields before the
    subclass's, so the spec's keys would otherwise move to the front: no reader minds, but the
    files and `status --json` stay as earlier versions wrote them, line for line."""
    ordered = {key: data[key] for key in keys if key in data}
    return ordered | {key: value for key, value in data.items() if key not in ordered}


def _require(data: dict[str, Any], names: list[str]) -> None:
    """A state file without one of ``names`` is corrupt: the spec's defaults are for what a user
    leaves out of `up`, not for guessing what a file lost (a route on, port 8000)."""
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")


class DesiredState(_StateRecord):
    """What the next `qpnserve up` (or `rollback --restart`) starts."""

    updated_at: datetime = Field(default_factory=_now)

    @model_validator(mode="before")
    @classmethod
    def _as_read(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _require(data, ["awq_m1"])  # the only fact a desired state always had
        return data

    @field_validator("server_module")
    @classmethod
    def _default_module_unnamed(cls, value: str | None) -> str | None:
        """The default module is recorded as None: the next `up` runs the default of its day,
        and the restart command names no --server-module."""
        return None if value == config.DEFAULT_SERVER_MODULE else value

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _in_file_order(handler(self), ("schema_version",))


# server.json's keys in the order `up` has always written them.
_RUNNING_KEYS = (
    "schema_version",
    "phase",
    "pid",
    "pgid",
    "proc_start_ticks",
    "started_at",
    "argv",
    "env",
    "cwd",
    "route_flag",
    "include_plugin",
    "host_kind",
    "host_version",
    "facts_file",
    "patch_id",
    "build_key",
    "model",
    "served_model_name",
    "tp",
    "host",
    "port",
    "extra_args",
    "server_module",
    "log_path",
    "report_dir",
    "ready_at",
    "api_key_set",
)


class RunningState(_StateRecord):
    """The server qpnserve started. Only `up` writes it; `down` and failed `up`s clear it.

    Its file holds the route as the flag's value the server's environment had
    (``route_flag``: "0" or "1", anything else is a corrupt file), not as ``awq_m1``."""

    # What ran is always known: the spec's None ("the default") never appears here.
    model: str
    served_model_name: str
    server_module: str
    phase: Phase
    pid: int
    pgid: int
    # Field 22 of /proc/<pid>/stat (clock ticks since boot): a pid that is alive with another
    # start time is a different process that reused the number, not our server.
    proc_start_ticks: int | None
    started_at: datetime
    argv: list[str]
    env: dict[str, str | None]  # only the variables that decide the route; None = unset
    cwd: str
    host_kind: HostKind
    host_version: str | None = None
    # The $QPNSERVE_FACTS_FILE the preflight read the host from (None: probed): status says so.
    facts_file: str | None = None
    patch_id: str | None = None
    build_key: str | None = None
    log_path: str
    report_dir: str
    ready_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _as_read(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "awq_m1" not in data:
            flag = data.get("route_flag")
            if flag not in config.ROUTE_FLAG_VALUES:
                raise ValueError(
                    f"route_flag must be one of {config.ROUTE_FLAG_VALUES}, got {flag!r}"
                )
            rest = {key: value for key, value in data.items() if key != "route_flag"}
            data = rest | {"awq_m1": flag == config.route_flag_value(True)}
        # What ran is recorded in full (extra args only if any were given).
        _require(data, [name for name in ServerSpec.model_fields if name != "extra_args"])
        return data

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if "awq_m1" in data:
            data["route_flag"] = self.route_flag
            del data["awq_m1"]
        return _in_file_order(data, _RUNNING_KEYS)

    @property
    def route_flag(self) -> RouteFlagValue:
        """The flag's value in the server's environment (``awq_m1`` as the server saw it)."""
        return config.route_flag_value(self.awq_m1)


def ensure_state_dir(path: Path) -> Path:
    """Create the state directory (0700) and tighten it if it is readable by others."""
    root = path
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(root.stat().st_mode)
        if mode & 0o077:
            os.chmod(root, 0o700)
    except OSError as exc:
        raise StateError(
            f"cannot create the state directory {root}: {exc.strerror or exc}",
            hint=f"set {config.STATE_DIR.name} to a writable directory",
        ) from None
    return root


@contextlib.contextmanager
def locked(root: Path, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the state lock; another qpnserve command holding it too long is a ConflictError."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(root / LOCK_FILE), mode=0o600)
    try:
        lock.acquire(timeout=timeout_s)
    except Timeout:
        raise ConflictError(
            f"the state in {root} is locked by another qpnserve command (waited {timeout_s:.0f} s)",
            hint="wait for the other command to finish, then retry",
        ) from None
    try:
        yield
    finally:
        lock.release()


M = TypeVar("M", bound=BaseModel)


def _read(path: Path, model: type[M]) -> M | None:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(
            f"cannot read state file {path}: {exc.strerror or exc}",
            hint="check the permissions of the state directory",
        ) from None
    try:
        return model.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise StateError(
            f"state file {path} is corrupt: {first}",
            hint=f"inspect it, stop any server by hand if one runs, then delete {path}",
        ) from None


def _write(path: Path, data: BaseModel) -> None:
    try:
        atomic_write_text(path, data.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        raise StateError(
            f"cannot write state file {path}: {exc.strerror or exc}",
            hint="check free space and the permissions of the state directory",
        ) from None


def read_desired(root: Path) -> DesiredState | None:
    return _read(root / DESIRED_FILE, DesiredState)


def write_desired(root: Path, desired: DesiredState) -> None:
    _write(root / DESIRED_FILE, desired)


def read_running(root: Path) -> RunningState | None:
    return _read(root / RUNNING_FILE, RunningState)


def write_running(root: Path, running: RunningState) -> None:
    _write(root / RUNNING_FILE, running)


def clear_running(root: Path, pid: int | None = None) -> bool:
    """Remove server.json; with ``pid``, only if it still records that server. True if removed."""
    path = root / RUNNING_FILE
    if pid is not None:
        current = read_running(root)
        if current is None or current.pid != pid:
            return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def logs_dir(root: Path) -> Path:
    return root / "logs"


def report_dir(root: Path) -> Path:
    return root / "reports"
