"""The archive itself: one folder of text files in a tar.gz, written atomically, mode 0600."""

from __future__ import annotations

import io
import os
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from qpnserve.config import Settings
from qpnserve.errors import StateError
from qpnserve.report.collect import collect, server_environ
from qpnserve.report.redact import secret_values


class ReportResult(BaseModel):
    archive: str
    size_bytes: int
    files: list[str]
    summary: dict[str, Any]


def default_out(now: datetime | None = None) -> Path:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return Path.cwd() / f"qpnserve-report-{stamp}.tar.gz"


def write_report(
    out: Path | None = None,
    log_lines: int = 200,
    url: str | None = None,
    *,
    settings: Settings,
) -> ReportResult:
    environ = dict(settings.environ)
    gathered = collect(environ, log_lines, url, settings=settings)
    _refuse_leftover_secrets(gathered.files, environ, settings)
    target = (out or default_out()).expanduser().resolve()
    folder = target.name.removesuffix(".tar.gz").removesuffix(".tgz")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, text in gathered.files.items():
                data = text.encode()
                info = tarfile.TarInfo(f"{folder}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StateError(
            f"cannot write the report archive {target}: {exc.strerror or exc}",
            hint="pass --out with a writable path",
        ) from None
    return ReportResult(
        archive=str(target),
        size_bytes=target.stat().st_size,
        files=sorted(gathered.files),
        summary=gathered.summary,
    )


def _refuse_leftover_secrets(
    files: dict[str, str], environ: dict[str, str], settings: Settings
) -> None:
    """Belt and braces: a secret value that survived redaction stops the report unwritten."""
    from qpnserve.lifecycle.control import status

    running = status(settings=settings).running
    secrets = secret_values(environ, server_environ(running.pid if running else None))
    for name, text in files.items():
        if any(value in text for value in secrets):
            raise StateError(
                f"the report was not written: a secret value survived redaction in {name}",
                hint="please report this as a qpnserve bug (without the archive)",
            )
