"""`status --url` (and `report --url`): a server qpnserve did not start, e.g. one its operator
launched with `vllm serve`. What HTTP says (health, models, version), what /proc says when it
listens on this machine (its processes and the route-deciding environment, if readable), and,
by name, what cannot be known."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from qpnserve.lifecycle.launch import RECORDED_ENV, port_holder_pid
from qpnserve.lifecycle.postmortem import ServerProcess, server_processes
from qpnserve.lifecycle.procs import descendants, group_members, read_environ, read_stat

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


class UrlStatus(BaseModel):
    url: str
    healthy: bool
    health_detail: str
    served_models: list[str] = Field(default_factory=list)
    version: str | None = None
    listener_pid: int | None = None  # the process listening on the port, when it is local
    processes: list[ServerProcess] = Field(default_factory=list)
    # Each route-deciding variable as the server's process started with it (source: its
    # /proc environ); None when that environment is not readable from here.
    route_env: dict[str, str | None] | None = None
    unknown: list[str] = Field(default_factory=list)  # what this command cannot know


def url_status(url: str, timeout_s: float = 5.0, *, api_key: str | None = None) -> UrlStatus:
    """``api_key``: $VLLM_API_KEY from the settings (None: no key sent)."""
    import httpx

    from qpnserve.auth import auth_headers, unauthorized_text

    base = url.rstrip("/").removesuffix("/v1")
    key = api_key
    healthy, detail, models, version = False, "", [], None
    with httpx.Client(timeout=timeout_s, headers=auth_headers(key)) as client:
        try:
            health = client.get(f"{base}/health")
            healthy, detail = health.status_code == 200, f"/health: HTTP {health.status_code}"
            listed = client.get(f"{base}/v1/models")
            if listed.status_code == 401:
                detail += f"; {unauthorized_text(key, '/v1/models')}"
            else:
                detail += f"; /v1/models: HTTP {listed.status_code}"
                data = listed.json().get("data", []) if listed.status_code == 200 else []
                models = [str(m.get("id")) for m in data if isinstance(m, dict)]
            answer = client.get(f"{base}/version")
            if answer.status_code == 200:
                version = str(answer.json().get("version"))
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            detail = (detail + "; " if detail else "") + f"no answer ({type(exc).__name__})"
    status = UrlStatus(
        url=base, healthy=healthy, health_detail=detail, served_models=models, version=version
    )
    _add_local_facts(status)
    return status


def _add_local_facts(status: UrlStatus) -> None:
    parts = urlsplit(status.url)
    unknown = [
        "whether every tensor-parallel rank took the route (only a server `qpnserve up` started "
        "writes route reports where qpnserve reads them)",
        "the server's launch arguments and start time (qpnserve did not record a start)",
    ]
    pid = port_holder_pid(parts.port or 80) if parts.hostname in _LOCAL_HOSTS else None
    if pid is None:
        unknown.insert(0, "its processes and environment (not a process visible on this machine)")
        status.unknown = unknown
        return
    status.listener_pid = pid
    stat = read_stat(pid)
    pids = set(group_members(stat.pgid)) if stat else set()
    pids |= {pid} | {s.pid for s in descendants(pid)}
    status.processes = server_processes(sorted(pids), pid)
    environ = read_environ(pid)
    if environ:
        status.route_env = {name: environ.get(name) for name in RECORDED_ENV}
    else:
        unknown.insert(0, "its environment, so the route flag (not readable: another user?)")
    status.unknown = unknown
