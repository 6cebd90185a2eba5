"""The one table of environment variables qpnserve reads or sets, each with why it exists.

Every option that users set in scripts also reads a ``QPNSERVE_*`` variable; those are listed
here so the README table and the code cannot drift: tests/preflight/test_readme_env.py checks
the README, and ``python tools/env_table.py --write`` regenerates its table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str


# The route switch, same name in native and patched hosts (contract section 5). Exactly "0" or "1".
ROUTE_FLAG = EnvVar(
    "VLLM_SM70_AWQ_QWEN38_QPN_M1",
    "the AWQ M1 route: '1' on (fail closed), '0' or unset off; any other value is an error",
)
ROUTE_FLAG_VALUES = ("0", "1")  # the only values a host accepts
# vLLM's allow-list of general plugins: comma-separated names, no whitespace trimming, empty = none.
VLLM_PLUGINS = EnvVar("VLLM_PLUGINS", "vLLM's comma-separated allow-list of general plugins")
STATE_DIR = EnvVar(
    "QPNSERVE_STATE_DIR", "state directory (desired/running state, logs, route reports, benches)"
)
# Set by `qpnserve up` for the server it starts: where each rank's plugin writes its route report.
REPORT_DIR = EnvVar(
    "QPNSERVE_REPORT_DIR", "where each tensor-parallel rank writes its route report"
)
VERIFY_CAPTURE_DIR = EnvVar(
    "QPNSERVE_VERIFY_CAPTURE_DIR", "set by live `verify`: where each rank captures its MoE calls"
)
BUILD_DIR = EnvVar("QPNSERVE_BUILD_DIR", "cache directory of compiled operator extensions")
# Build scripts for a GPU-less builder pin the target once (7.0 for V100).
BUILD_ARCH = EnvVar(
    "QPNSERVE_BUILD_ARCH", "default --arch of `qpnserve build`, also read by `up` (e.g. 7.0)"
)
MODEL = EnvVar("QPNSERVE_MODEL", "default --model (checkpoint directory)")
TP = EnvVar("QPNSERVE_TP", "default --tp (tensor-parallel size)")
# Recorded facts instead of probing: for reviewing a recorded host offline, and for tests.
FACTS_FILE = EnvVar("QPNSERVE_FACTS_FILE", "read preflight facts from this JSON instead of probing")
# `bench smoke`: where the server answers and which served model to ask, so scripts set them once.
BENCH_URL = EnvVar("QPNSERVE_URL", "default --url of `bench smoke` (the server's base URL)")
SERVED_MODEL = EnvVar(
    "QPNSERVE_SERVED_MODEL", "default --model of `bench smoke` (a served model name)"
)
# `up`/`down`/`rollback`: what scripts set once. The server module is replaceable so tests can
# launch a stand-in process instead of vLLM; the output always names the module that ran.
# The default lives here, not in lifecycle/, so `qpnserve --help` shows it without loading more.
DEFAULT_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_MODULE = EnvVar(
    "QPNSERVE_SERVER_MODULE",
    "default --server-module of `up` (default vllm.entrypoints.openai.api_server)",
)
HOST = EnvVar("QPNSERVE_HOST", "default --host of `up` (the address the server binds)")
PORT = EnvVar("QPNSERVE_PORT", "default --port of `up`")
UP_TIMEOUT = EnvVar("QPNSERVE_UP_TIMEOUT_S", "default --timeout-s of `up` (wait for readiness)")
STOP_TIMEOUT = EnvVar(
    "QPNSERVE_STOP_TIMEOUT_S", "default grace period of `down` before SIGKILL, in seconds"
)

# vLLM's own key variable: `up` hands the key to the server through it (never as an argument),
# and status, bench and verify send it; qpnserve stores it nowhere (qpnserve/auth.py).
API_KEY = EnvVar(
    "VLLM_API_KEY", "the server's API key: `up` passes it to vLLM, the clients send it"
)

# `qpnserve bench op` defaults (scripts that time the operator in a loop set these once).
BENCH_OP_FORMAT = EnvVar("QPNSERVE_BENCH_OP_FORMAT", "default --format of bench op (4byte|3byte)")
BENCH_OP_LAYERS = EnvVar("QPNSERVE_BENCH_OP_LAYERS", "default --layers of bench op")
BENCH_OP_ITERS = EnvVar("QPNSERVE_BENCH_OP_ITERS", "default --iters of bench op")
# Recorded into benchmark results when the code runs from a copy without .git (a GPU host).
GIT_COMMIT = EnvVar("QPNSERVE_GIT_COMMIT", "git commit recorded in results when .git is absent")

ALL_VARS: tuple[EnvVar, ...] = (
    ROUTE_FLAG,
    VLLM_PLUGINS,
    STATE_DIR,
    REPORT_DIR,
    VERIFY_CAPTURE_DIR,
    BUILD_DIR,
    BUILD_ARCH,
    MODEL,
    TP,
    FACTS_FILE,
    BENCH_URL,
    SERVED_MODEL,
    SERVER_MODULE,
    HOST,
    PORT,
    UP_TIMEOUT,
    STOP_TIMEOUT,
    API_KEY,
    BENCH_OP_FORMAT,
    BENCH_OP_LAYERS,
    BENCH_OP_ITERS,
    GIT_COMMIT,
)

PLUGIN_NAME = "qpnserve_awq_m1"  # entry point name in group vllm.general_plugins
APP_NAME = "qpnserve"


def state_dir() -> Path:
    """The state directory: $QPNSERVE_STATE_DIR, else the user's XDG state dir for qpnserve."""
    override = os.environ.get(STATE_DIR.name)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_state_dir

    return Path(user_state_dir(APP_NAME, appauthor=False))


def build_dir() -> Path:
    """The extension cache: $QPNSERVE_BUILD_DIR, else the user's cache dir for qpnserve."""
    override = os.environ.get(BUILD_DIR.name)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP_NAME, appauthor=False)) / "extensions"
