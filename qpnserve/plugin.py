"""The vLLM general plugin (entry point ``vllm.general_plugins: qpnserve_awq_m1``).

vLLM calls register() once in every process it starts (API server, engine core, each tensor-
parallel worker), before the model loads. Import of this module is trivial (stdlib and qpnserve's
flag parser only): an import error would be logged by vLLM and the server would go on without the
plugin, so every check happens inside register(), where an exception stops the process.

- flag unset or "0": return at once; no extension lookup, no host import, no wrapping;
- any other value than "0"/"1": DispatchError naming the variable and the accepted values;
- "1": qpnserve.dispatch.runtime.activate(settings) (host check, manifest drift check, prebuilt
  extension load, wrapping: fail closed). On a native host only an observer, which never
  raises: any failure is one warning line and the server goes on with its own route.
  Re-entrant: a second call in the same process finds the class marker and changes nothing.
  Never initialises CUDA.

Each call writes one line to stderr (the server log): the pid and title of the process.
A refusal (any QpnError above) is also written to the report dir as route-refusal-pid<P>.json
before it propagates, so `qpnserve up` can say why the server stopped.
"""

from __future__ import annotations

import contextlib
import os

from qpnserve.config import ROUTE_FLAG, ROUTE_FLAG_VALUES, Settings, load_settings
from qpnserve.dispatch.flag import parse_route_flag
from qpnserve.errors import QpnError


def register() -> None:
    settings = load_settings()  # this process's one read of its environment (config.py)
    _announce(settings.route_flag)
    try:
        if not parse_route_flag(settings.route_flag):
            return
        from qpnserve.dispatch.runtime import activate

        activate(settings)
    except QpnError as exc:
        _record_refusal(settings, exc)
        raise


def _announce(raw_flag: str | None) -> None:
    """One line per process vLLM loads the plugin in, into the server's log (stderr): which
    processes ran it is then readable after the fact, workers that died included."""
    with contextlib.suppress(Exception):
        import multiprocessing
        import sys

        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        title = args[0] if args and "::" in args[0] else " ".join(args)[:100]
        sys.stderr.write(
            f"qpnserve plugin: registered in pid {os.getpid()} ({title}; "
            f"{multiprocessing.current_process().name}), {ROUTE_FLAG.name}={raw_flag!r}\n"
        )
        sys.stderr.flush()


def _record_refusal(settings: Settings, exc: QpnError) -> None:
    """Leave the refusal where `qpnserve up` looks (the report dir): the exception stops this
    process and the server, and `up` names the reason in one line instead of a log tail.
    Best effort: failing to write must never hide the refusal itself."""
    with contextlib.suppress(Exception):
        import multiprocessing

        from qpnserve.dispatch.recorder import rank_report_dir
        from qpnserve.route_report import RouteRefusal, write_refusal

        raw_flag = settings.route_flag
        refusal = RouteRefusal(
            route_flag=raw_flag if raw_flag in ROUTE_FLAG_VALUES else repr(raw_flag),
            process=multiprocessing.current_process().name,
            pid=os.getpid(),
            reason=exc.message,
        )
        write_refusal(rank_report_dir(settings), refusal)
