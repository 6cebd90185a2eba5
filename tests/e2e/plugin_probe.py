"""A second vLLM general plugin, for the end-to-end suite only: it watches qpnserve's plugin
decide, in every vLLM process, as vLLM itself loads and calls it.

vLLM imports every allowed plugin first and then calls them in discovery order; this one is
discovered first (its dist-info lies on PYTHONPATH, before site-packages), so when it is called
qpnserve.plugin is already imported but not yet called. It wraps the flag parser that
qpnserve.plugin.register() looks up at call time, and records per process (pid, name, the flag
seen, the decision) into $QPNSERVE_E2E_PROBE_DIR. qpnserve's plugin itself runs unchanged.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

ENTRY_POINTS = "[vllm.general_plugins]\nqpnserve_e2e_probe = tests.e2e.plugin_probe:register\n"


def install(site: Path) -> None:
    """Make this module discoverable as the `qpnserve_e2e_probe` plugin from ``site``."""
    info = site / "qpnserve_e2e_probe-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: qpnserve-e2e-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)


def register() -> None:
    out = Path(os.environ["QPNSERVE_E2E_PROBE_DIR"])
    plugin = sys.modules.get("qpnserve.plugin")
    record: dict[str, object] = {
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
        "qpnserve_plugin_imported": plugin is not None,
        "decisions": [],
    }

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"probe-{os.getpid()}.json").write_text(json.dumps(record))

    write()
    if plugin is None:
        return
    parse = plugin.parse_route_flag

    def watched(raw: str | None) -> bool:
        route_on = parse(raw)
        record["decisions"].append({"flag": raw, "route_on": route_on})  # type: ignore[attr-defined]
        write()
        return route_on

    plugin.parse_route_flag = watched
