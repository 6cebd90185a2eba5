"""Where each route-related value of a running server came from: the host's profile, the
environment, or the host's default; read from the provenance record the host itself wrote.

ReVolta 0.1.4's profile (``vllm/revolta_profile.py``) keeps, in ``os.environ``, the variable
``VLLM_REVOLTA_PROFILE_PROVENANCE``: one JSON object ``{"version": 1, "values": {NAME:
{"source": S, "value": V}}}`` (keys sorted), S one of ``profile``, ``environment``,
``upstream_default``, V a string, with a row only for the audited names set at the time it
wrote the record. It writes the record after its process started, and every process started
from it afterwards (engine core, workers) inherits it. Linux shows a process's environment as it
started (``/proc/PID/environ``), so qpnserve reads the record from the server's processes that
carry it; where none does, or none can be read, the sources are "unknown", with the reason.

Effects: ``read_environ`` only. The rest is pure and tested with literal records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from qpnserve.host_profile import PROVENANCE_VAR
from qpnserve.host_routes import GROUPED_ROUTE_NAMES, ROUTE_FLAG_NAME
from qpnserve.preflight.layer_filters import LAYER_FILTERS

# The values that decide which kernels ReVolta runs on the AWQ MoE layers the route takes:
# the route, the grouped route on the same layers, the host's other small-batch path, the bank
# format the operator reads (3-byte metadata, nibble-packed zeros), the AWQ small-shape tuning
# the profile turns on, and the per-layer filters of the batched path.
ROUTE_VALUE_NAMES = (
    ROUTE_FLAG_NAME,
    *GROUPED_ROUTE_NAMES,
    "VLLM_SM70_AWQ_QWEN38_MOE_COMPACT_GROUPED_DECODE",
    "VLLM_SM70_AWQ_MOE_COMPACT_METADATA",
    "VLLM_SM70_AWQ_MOE_INT4_ZERO",
    "VLLM_SM70_AWQ_TUNE_SMALL_SHAPES",
    *LAYER_FILTERS,
)
Source = Literal["profile", "environment", "default", "unknown"]
# The host's words for the sources, and ours ("default": the host's own default applies).
_HOST_SOURCES: dict[str, Source] = {
    "profile": "profile",
    "environment": "environment",
    "upstream_default": "default",
}
_SHORT_PREFIX = "VLLM_SM70_AWQ_"


class RouteValue(BaseModel):
    name: str
    value: str | None  # None: unset in the server (the host's default applies), or unknown
    source: Source


class RouteValues(BaseModel):
    known: bool
    basis: str | None = None  # where the sources were read
    reason: str | None = None  # why they are unknown
    values: list[RouteValue]


@dataclass(frozen=True)
class ProcessEnviron:
    pid: int
    environ: dict[str, str] | None  # None: not readable
    error: str | None = None  # why not


def read_environ(pid: int, proc: Path = Path("/proc")) -> ProcessEnviron:
    """A process's environment as it started. Only the route's names are ever taken from it."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except FileNotFoundError:
        return ProcessEnviron(pid, None, "gone")
    except PermissionError:
        return ProcessEnviron(pid, None, "permission denied (another user's process?)")
    except OSError as exc:
        return ProcessEnviron(pid, None, exc.strerror or str(exc))
    environ: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, eq, value = entry.decode("utf-8", "replace").partition("=")
        if eq:
            environ[name] = value
    return ProcessEnviron(pid, environ)


def parse_provenance(text: str) -> dict[str, tuple[str, Source]]:
    """NAME -> (value, source) of a record; ValueError naming what is wrong with it."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(payload, dict) or payload.get("version") != 1:
        raise ValueError("not a version 1 record")
    rows = payload.get("values")
    if not isinstance(rows, dict):
        raise ValueError("no 'values' object")
    parsed: dict[str, tuple[str, Source]] = {}
    for name, row in rows.items():
        value = row.get("value") if isinstance(row, dict) else None
        source = row.get("source") if isinstance(row, dict) else None
        if not isinstance(value, str) or source not in _HOST_SOURCES:
            raise ValueError(f"row {name!r} is not {{'source': ..., 'value': '...'}}")
        parsed[name] = (value, _HOST_SOURCES[source])
    return parsed


def _unknown(reason: str) -> RouteValues:
    values = [RouteValue(name=n, value=None, source="unknown") for n in ROUTE_VALUE_NAMES]
    return RouteValues(known=False, reason=reason, values=values)


def _from_start_env(
    environ: Mapping[str, str], record: Mapping[str, tuple[str, Source]]
) -> list[RouteValue]:
    values = []
    for name in ROUTE_VALUE_NAMES:
        if name in record:
            value, source = record[name]
        elif name in environ:
            # Outside the profile's inventory (or set before the record): as the process started.
            value, source = environ[name], "environment"
        else:
            value, source = None, "default"
        values.append(RouteValue(name=name, value=value, source=source))
    return values


def route_values(processes: Sequence[ProcessEnviron], host_kind: str | None) -> RouteValues:
    """The route values of a server from its processes' start environments (pure)."""
    if not processes:
        return _unknown("no process of the server is running to read")
    readable = [p for p in processes if p.environ is not None]
    if not readable:
        errors = "; ".join(f"pid {p.pid}: {p.error}" for p in processes)
        return _unknown(f"cannot read the server's environment (/proc/PID/environ: {errors})")
    carriers = [p for p in readable if p.environ and PROVENANCE_VAR in p.environ]
    if carriers:
        carrier = carriers[-1]  # the latest started of those the caller lists in start order
        assert carrier.environ is not None
        try:
            record = parse_provenance(carrier.environ[PROVENANCE_VAR])
        except ValueError as exc:
            return _unknown(f"pid {carrier.pid}'s {PROVENANCE_VAR} cannot be read: {exc}")
        return RouteValues(
            known=True,
            basis=f"{PROVENANCE_VAR} of pid {carrier.pid}, written by the host's profile",
            values=_from_start_env(carrier.environ, record),
        )
    pids = ", ".join(str(p.pid) for p in readable)
    if host_kind == "native":
        return _unknown(
            f"no process of the server (pids {pids}) started with {PROVENANCE_VAR}: the host "
            "writes it after its own start, so only the processes it starts afterwards (a "
            "spawned engine core or worker) show it"
        )
    leader = readable[0]
    assert leader.environ is not None
    return RouteValues(
        known=True,
        basis=f"start environment of pid {leader.pid} (a {host_kind or 'unknown'} host has no "
        "launch profile that writes values)",
        values=_from_start_env(leader.environ, {}),
    )


def sources_line(report: RouteValues) -> str:
    """Text `status`'s one line: the values set by the environment and by the profile, then how
    many are at the host's default (`status --json` names them all)."""
    if not report.known:
        return f"unknown ({report.reason})"
    parts = []
    for source in ("environment", "profile"):
        names = [
            f"{v.name.removeprefix(_SHORT_PREFIX)}={v.value}"
            for v in report.values
            if v.source == source
        ]
        if names:
            parts.append(f"{source} {' '.join(names)}")
    defaults = sum(v.source == "default" for v in report.values)
    if defaults:
        parts.append(f"{'the other ' if parts else 'all '}{defaults} at the host's default")
    return f"{'; '.join(parts)} ({_SHORT_PREFIX}*)"


def server_route_values(pids: Sequence[int], host_kind: str | None) -> RouteValues:
    """The route values of the live processes ``pids`` (the server's leader first)."""
    return route_values([read_environ(pid) for pid in pids], host_kind)
