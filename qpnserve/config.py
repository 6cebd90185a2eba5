"""The one table of environment variables qpnserve reads or sets, each with why it exists, and
the settings object that is the only reader of this process's environment.

Every option that users set in scripts also reads a ``QPNSERVE_*`` variable; those are listed
here so the table in docs/commands.md and the code cannot drift: tests/preflight/test_env_table.py
checks it, and ``python tools/env_table.py --write`` regenerates it.

Settings are read at two edges, once each: the CLI's root callback (qpnserve/cli/app.py, which
every command invocation runs first) and the plugin's ``register`` (qpnserve/plugin.py, in every
vLLM process). Each calls ``load_settings()`` and passes the frozen ``Settings`` down; nothing
else reads ``os.environ`` (tests/test_settings_edges.py holds it). Typer's ``envvar=`` options are
click reading the environment at the same edge.

A child process's environment (``env=`` of a subprocess) is built from ``settings.environ``, the
snapshot taken at the edge (a copy with qpnserve's own variables set on top), never from
``os.environ``: what the preflight judged is what the child gets. The one write to this process's
own environment is ``process_environ_set`` below (torch's extension builder reads its arch list
only from there).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str


# The route switch, same name in native and patched hosts (contract section 5). Exactly "0" or "1".
ROUTE_FLAG = EnvVar(
    "VLLM_SM70_AWQ_QWEN38_QPN_M1",
    "the AWQ M1 route: '1' on (fail closed), '0' or unset off; any other value is an error",
)
# The route is one bool, named ``awq_m1`` from the CLI (--awq-m1) through the options and the
# desired state; the environment, the running state and the route reports write it as the flag's
# value. dispatch/flag.py's parse_route_flag is the one validator of a value read back.
RouteFlagValue = Literal["0", "1"]
ROUTE_FLAG_VALUES: tuple[RouteFlagValue, ...] = ("0", "1")


def route_flag_value(awq_m1: bool) -> RouteFlagValue:
    """The flag's value for the route on (``awq_m1``) or off."""
    return "1" if awq_m1 else "0"


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
    "QPNSERVE_VERIFY_CAPTURE_DIR",
    "set by live `verify` for its own server: where each rank captures its MoE calls (one "
    "exported in your shell is not passed on to a server)",
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

# The user's defaults, each written once: the CLI's options, the lifecycle's option records and
# the state files take them from here (tests/test_defaults_once.py holds that no other module
# restates them).
DEFAULT_TP = 4  # the operator's geometry is for 4 ranks (geometry.TP_SIZE)
DEFAULT_HOST = "127.0.0.1"  # vLLM's own default is every interface; the route is a local service
DEFAULT_PORT = 8000  # vLLM's default port
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"  # where `bench smoke` looks last
DEFAULT_UP_TIMEOUT_S = 1800.0  # 4x V100 loads take minutes; CUDA graph capture adds more
DEFAULT_STOP_TIMEOUT_S = 60.0  # grace period of a process-group stop before SIGKILL

PLUGIN_NAME = "qpnserve_awq_m1"  # entry point name in group vllm.general_plugins
APP_NAME = "qpnserve"


@dataclass(frozen=True)
class Settings:
    """This process's environment as qpnserve reads it, taken once at an edge (load_settings).

    The typed values below are derived from ``environ`` on each access (cheap: a lookup), so a
    ``Settings`` is the snapshot alone and compares by it."""

    environ: Mapping[str, str]  # read-only snapshot; the base of every child's environment

    def _value(self, var: EnvVar) -> str | None:
        return self.environ.get(var.name) or None  # empty means unset, as before

    @property
    def route_flag(self) -> str | None:
        """$VLLM_SM70_AWQ_QWEN38_QPN_M1 as written (parsed by qpnserve.dispatch.flag)."""
        return self.environ.get(ROUTE_FLAG.name)

    @property
    def state_dir(self) -> Path:
        """$QPNSERVE_STATE_DIR, else the user's XDG state dir for qpnserve."""
        override = self._value(STATE_DIR)
        if override:
            return Path(override).expanduser()
        from platformdirs import user_state_dir

        return Path(user_state_dir(APP_NAME, appauthor=False))

    @property
    def build_dir(self) -> Path:
        """$QPNSERVE_BUILD_DIR, else the user's cache dir for qpnserve."""
        override = self._value(BUILD_DIR)
        if override:
            return Path(override).expanduser()
        from platformdirs import user_cache_dir

        return Path(user_cache_dir(APP_NAME, appauthor=False)) / "extensions"

    @property
    def report_dir(self) -> Path | None:
        """$QPNSERVE_REPORT_DIR (set by `qpnserve up` for its server), else None."""
        override = self._value(REPORT_DIR)
        return Path(override).expanduser() if override else None

    @property
    def verify_capture_dir(self) -> Path | None:
        """$QPNSERVE_VERIFY_CAPTURE_DIR (set by live `verify` for its server), else None."""
        override = self._value(VERIFY_CAPTURE_DIR)
        return Path(override) if override else None

    @property
    def build_arch(self) -> str | None:
        return self._value(BUILD_ARCH)

    @property
    def facts_file(self) -> Path | None:
        override = self._value(FACTS_FILE)
        return Path(override) if override else None

    @property
    def git_commit(self) -> str | None:
        return self._value(GIT_COMMIT)


def with_environ(settings: Settings, changes: Mapping[str, str | None]) -> Settings:
    """The snapshot with ``changes`` applied (None: the variable removed), for a child that
    must see them (live `verify` hands its server the capture dir this way)."""
    environ = {k: v for k, v in settings.environ.items() if k not in changes}
    environ.update({k: v for k, v in changes.items() if v is not None})
    return Settings(MappingProxyType(environ))


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings from ``environ`` (default: this process's environment), frozen.

    Call it only at an edge (the CLI's root callback, the plugin's register) and in tests."""
    return Settings(MappingProxyType(dict(os.environ if environ is None else environ)))


@contextlib.contextmanager
def process_environ_set(name: str, value: str | None) -> Iterator[None]:
    """Set (``None``: leave as it is) one variable of this process's own environment for the
    duration, then restore it. Only for a library that reads nothing but ``os.environ``
    (torch.utils.cpp_extension's TORCH_CUDA_ARCH_LIST); children get ``settings.environ``."""
    if value is None:
        yield
        return
    backup = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if backup is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = backup
