"""What `qpnserve report` gathers, each piece a text file of the archive. Every piece passes
through redact.py before it is kept; nothing reads a weight file (the checkpoint's facts come
from its headers and config, as `check` reads them)."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qpnserve import __version__
from qpnserve.auth import api_key_from_env
from qpnserve.config import DEFAULT_TP, Settings
from qpnserve.report.redact import redact_argv, redact_env, redact_text, secret_values

LOG_LINES = 200
_COMMAND_TIMEOUT_S = 30.0
# Variables a maintainer asks about: the host's, CUDA's, the package index's, qpnserve's.
_ENV_PREFIXES = ("VLLM_", "QPNSERVE_", "CUDA_", "NCCL_", "PIP_", "HF_", "TORCH", "PYTORCH_")
_ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "UV_INDEX_URL")
# vLLM logs request contents with --enable-log-requests: prompts, token ids and outputs.
_REQUEST_CONTENT = re.compile(
    r"Received request|prompt:|prompt_token_ids|Generated response|output:"
)
REQUEST_LINE_REMOVED = "[a line with request content (prompt or completion) removed]"


@dataclass
class Collected:
    files: dict[str, str] = field(default_factory=dict)  # archive name -> redacted text
    summary: dict[str, Any] = field(default_factory=dict)
    redacted_names: list[str] = field(default_factory=list)  # variables whose value was hidden


def server_environ(pid: int | None) -> dict[str, str]:
    """The running server's environment (the same user may read it): its key is scrubbed too."""
    from qpnserve.lifecycle.procs import read_environ

    return read_environ(pid)


def collect(
    environ: Mapping[str, str],
    log_lines: int = LOG_LINES,
    url: str | None = None,
    *,
    settings: Settings,
) -> Collected:
    """Everything, redacted. ``url``: also a server qpnserve did not start (`status --url`)."""
    from qpnserve.lifecycle.control import status
    from qpnserve.lifecycle.remote import url_status

    out = Collected()
    report = status(settings=settings)
    running = report.running
    alive = report.server not in ("gone", "not running")
    server_env = server_environ(running.pid if running and alive else None)
    key = api_key_from_env(settings.environ)
    remote = url_status(url, api_key=key) if url else None
    remote_env = server_environ(remote.listener_pid if remote else None)
    secrets = secret_values(environ, server_env, remote_env)

    def keep(name: str, text: str) -> None:
        out.files[name] = redact_text(text, secrets)

    keep("version.txt", _version_text())
    check = _check(report, environ, settings)
    keep("check.json", check[0])
    keep("host.json", json.dumps(check[1], indent=2))
    keep("status.json", _redacted_model(report.model_dump(mode="json"), secrets))
    keep("route.json", json.dumps(_route_values(report, environ), indent=2))
    if remote is not None:
        keep("url-status.json", remote.model_dump_json(indent=2))
    root = Path(report.state_dir)
    for name in ("desired.json", "server.json"):
        path = root / name
        if path.is_file():
            keep(f"state/{name}", _redacted_json_file(path, secrets))
    reports_dir = Path(running.report_dir) if running else root / "reports"
    for path in sorted(reports_dir.glob("*.json")) if reports_dir.is_dir() else []:
        keep(f"reports/{path.name}", path.read_text(errors="replace"))
    keep("server-log-tail.txt", _log_tail(root, running.log_path if running else None, log_lines))
    keep("nvidia-smi-topo.txt", _command(["nvidia-smi", "topo", "-m"]))
    keep("nvidia-smi-q.txt", _command(["nvidia-smi", "-q"]))
    keep("packages.txt", _packages())
    keep("environment.json", json.dumps(_environment(environ, secrets), indent=2))
    out.redacted_names = sorted(n for n in _environment(environ, set()) if _is_hidden(n, environ))
    out.summary = {
        "qpnserve_version": __version__,
        "host": check[1].get("label"),
        "check": check[2],
        "server": _server_line(report)
        if remote is None
        else f"{remote.url} (not started by qpnserve): {remote.health_detail}",
        "redacted_variables": out.redacted_names,
        "not_included": ["model weights", "prompts and completions"],
    }
    return out


def _is_hidden(name: str, environ: Mapping[str, str]) -> bool:
    from qpnserve.report.redact import is_secret_name

    return is_secret_name(name) and name in environ


def _version_text() -> str:
    return (
        f"qpnserve {__version__}\nPython {platform.python_version()} ({sys.executable})\n"
        f"{platform.platform()}\n"
    )


def _check(
    report: Any, environ: Mapping[str, str], settings: Settings
) -> tuple[str, dict[str, Any], str]:
    """(`check --json` for the desired model and TP, the host record, one summary line)."""
    from qpnserve.errors import QpnError
    from qpnserve.lifecycle.guards_probe import with_guard_rows
    from qpnserve.preflight import run_preflight

    desired = report.desired
    model = Path(desired.model) if desired and desired.model else None
    tp = desired.tp if desired else DEFAULT_TP
    awq_m1 = desired.awq_m1 if desired else True
    try:
        preflight = run_preflight(model, settings=settings, tp=tp, awq_m1=awq_m1, environ=environ)
    except QpnError as exc:
        return json.dumps({"error": exc.message}), {"label": "unknown"}, f"not run: {exc.message}"
    preflight = with_guard_rows(preflight, environ, tp, model)
    host = preflight.facts.host
    label = f"{host.dist_name} {host.version} ({host.kind})" if host and host.found else None
    host_record = {"label": label or "no vllm found", **(host.model_dump() if host else {})}
    counts = ", ".join(f"{n} {s}" for s, n in preflight.counts().items() if n)
    failed = preflight.failed()
    line = counts + (f"; first FAIL {failed[0].name}: {failed[0].reason}" if failed else "")
    return preflight.model_dump_json(indent=2), host_record, line


def _route_values(report: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """Each route-deciding variable: what the running server got (recorded by `up` at start)
    and what this shell holds, each with where it comes from."""
    from qpnserve.lifecycle.launch import RECORDED_ENV

    recorded = report.running.env if report.running else {}
    values = {}
    for name in RECORDED_ENV:
        started = recorded.get(name) if report.running else None
        values[name] = {
            "server": started,
            "server_source": "server.json (recorded by `qpnserve up`)" if report.running else None,
            "this_shell": environ.get(name),
        }
    return {"route_text": report.route_text, "values": values}


def _redacted_model(data: dict[str, Any], secrets: set[str]) -> str:
    for record in (data.get("running"), data.get("desired")):
        if isinstance(record, dict):
            _redact_record(record, secrets)
    return json.dumps(data, indent=2, default=str)


def _redact_record(record: dict[str, Any], secrets: set[str]) -> None:
    for key in ("argv", "extra_args"):
        if isinstance(record.get(key), list):
            record[key] = redact_argv(record[key], secrets)
    if isinstance(record.get("env"), dict):
        env = {k: v for k, v in record["env"].items() if v is not None}
        record["env"] = {**record["env"], **redact_env(env, secrets)}


def _redacted_json_file(path: Path, secrets: set[str]) -> str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    if isinstance(data, dict):
        _redact_record(data, secrets)
    return json.dumps(data, indent=2)


def _log_tail(root: Path, log_path: str | None, num_lines: int) -> str:
    from qpnserve.lifecycle.procs import log_tail

    path = Path(log_path) if log_path else None
    if path is None or not path.is_file():
        logs = sorted((root / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
        path = logs[-1] if logs else None
    if path is None:
        return "no server log in the state folder\n"
    lines = log_tail(path, num_lines, max_bytes=1024 * 1024)
    kept = [REQUEST_LINE_REMOVED if _REQUEST_CONTENT.search(ln) else ln for ln in lines]
    return f"# last {len(kept)} lines of {path.name}\n" + "\n".join(kept) + "\n"


def _command(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return f"not available: {argv[0]} is not on PATH\n"
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not available: {' '.join(argv)} failed: {exc}\n"
    return f"$ {' '.join(argv)}  (exit {done.returncode})\n{done.stdout}{done.stderr}"


def _packages() -> str:
    """This Python's distributions (qpnserve runs in the host's Python), as `pip freeze` would
    name them, direct URLs included (their credentials are redacted like any text)."""
    from importlib.metadata import distributions

    lines = set()
    for dist in distributions():
        name = dist.metadata["Name"] or "?"
        direct = dist.read_text("direct_url.json")
        url = None
        if direct:
            try:
                url = json.loads(direct).get("url")
            except ValueError:
                url = None
        lines.add(f"{name} @ {url}" if url else f"{name}=={dist.version}")
    return f"# {sys.executable}\n" + "\n".join(sorted(lines, key=str.lower)) + "\n"


def _environment(environ: Mapping[str, str], secrets: set[str]) -> dict[str, str]:
    chosen = {
        k: v
        for k, v in environ.items()
        if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES or "TOKEN" in k.upper()
    }
    return redact_env(chosen, secrets)


def _server_line(report: Any) -> str:
    running = report.running
    if running is None:
        return "no server recorded"
    route = "on" if running.route_flag == "1" else "off"
    cause = f" ({report.exit_cause})" if report.exit_cause else ""
    return (
        f"{report.server}{cause}, pid {running.pid}, {running.base_url}, TP {running.tp}, "
        f"route {route}, host {running.host_kind} {running.host_version or ''}".rstrip()
    )
