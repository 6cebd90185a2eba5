"""The server's command line and environment (pure), and the effects of starting it.

Pure builders (tested directly): ``build_argv``, ``build_env``, ``plugin_allow_list``,
``route_env_record``. Effects: ``start_server`` (own session, logs to a file), ``port_holder``.
Waiting for readiness lives in readiness.py, process-group probing and stopping in procs.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qpnserve import config
from qpnserve.errors import ServerError, UsageError
from qpnserve.host_profile import gives_way
from qpnserve.host_routes import GROUPED_ROUTE_NAMES


@dataclass(frozen=True)
class ServerDefault:
    """One default server option; ``family`` lists every spelling that overrides it."""

    args: tuple[str, ...]
    family: tuple[str, ...]


# The host's own launch instructions (contract section 1); a user overrides any of them by
# passing the option after `--`. V100 has no bf16, hence float16; the evidence runs used prefix
# caching off; text-only serving turns the vision encoder's inputs off.
SERVER_DEFAULTS: tuple[ServerDefault, ...] = (
    ServerDefault(("--trust-remote-code",), ("trust-remote-code", "no-trust-remote-code")),
    ServerDefault(("--dtype", "float16"), ("dtype",)),
    ServerDefault(("--attention-backend", "FLASH_ATTN_V100"), ("attention-backend",)),
    ServerDefault(("--gpu-memory-utilization", "0.88"), ("gpu-memory-utilization",)),
    ServerDefault(("--max-model-len", "8192"), ("max-model-len",)),
    # The benchmark's largest concurrency cell is 8.
    ServerDefault(("--max-num-seqs", "8"), ("max-num-seqs",)),
    ServerDefault(("--max-num-batched-tokens", "8192"), ("max-num-batched-tokens",)),
    ServerDefault(
        ("--no-enable-prefix-caching",), ("enable-prefix-caching", "no-enable-prefix-caching")
    ),
    ServerDefault(("--limit-mm-per-prompt", '{"image":0,"video":0}'), ("limit-mm-per-prompt",)),
)

# Options qpnserve sets from its own flags: it needs their values to probe and verify the server.
OWNED_OPTIONS = {
    "model": "--model",
    "served-model-name": "--served-model-name",
    "tensor-parallel-size": "--tp",
    "tp": "--tp",
    "host": "--host",
    "port": "--port",
}


def option_key(arg: str) -> str | None:
    """``--max_num_seqs=8`` -> ``max-num-seqs``; None for a value (not an option)."""
    if arg == "-tp":
        return "tp"
    if not arg.startswith("--") or arg == "--":
        return None
    return arg[2:].split("=", 1)[0].replace("_", "-")


def check_extra_args(extra_args: Sequence[str]) -> None:
    """Refuse extra args that would change what qpnserve probes (port, model, ...)."""
    for arg in extra_args:
        key = option_key(arg)
        if key in OWNED_OPTIONS:
            raise UsageError(
                f"pass {arg.split('=', 1)[0]} as qpnserve's own option, not after `--`",
                hint=f"use `qpnserve up {OWNED_OPTIONS[key]} ...`; qpnserve needs the value "
                "to check the server it starts",
            )


def build_argv(
    *,
    python: str,
    server_module: str,
    model: Path,
    served_model_name: str,
    tp: int,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
    host_has_profile: bool = False,
) -> list[str]:
    """The exact server argv: qpnserve's options, the defaults the user did not override and the
    host's own launch profile does not supply (qpnserve.host_profile's table), extras."""
    check_extra_args(extra_args)
    overridden = {option_key(a) for a in extra_args} - {None}
    argv = [python, "-m", server_module, "--model", str(model)]
    argv += ["--served-model-name", served_model_name, "--tensor-parallel-size", str(tp)]
    argv += ["--host", host, "--port", str(port)]
    for default in SERVER_DEFAULTS:
        supplied = gives_way(default.family[0], host_has_profile=host_has_profile)
        if not overridden.intersection(default.family) and not supplied:
            argv += default.args
    return argv + list(extra_args)


def plugin_allow_list(
    user_value: str | None, *, include_plugin: bool, installed: Sequence[str]
) -> str:
    """The VLLM_PLUGINS value: the user's names (or every installed plugin), ours in or out.

    vLLM reads it as a comma-separated allow-list with no whitespace trimming, and unset means
    "load every installed plugin". So leaving ours out needs an explicit list of the others,
    and keeping ours in must not drop a name the user chose.
    """
    names = user_value.split(",") if user_value is not None else list(installed)
    kept: list[str] = []
    for name in names:
        if name and name != config.PLUGIN_NAME and name not in kept:
            kept.append(name)
    if include_plugin:
        kept.append(config.PLUGIN_NAME)
    return ",".join(kept)


def build_env(
    base_env: Mapping[str, str],
    *,
    awq_m1: bool,
    include_plugin: bool,
    report_dir: Path,
    installed_plugins: Sequence[str],
) -> dict[str, str]:
    """The server's environment: the caller's, plus the route flag, plugins and report dir.

    The flag is always explicit: newer native hosts turn the route on when it is unset.
    """
    env = dict(base_env)
    env[config.ROUTE_FLAG.name] = config.route_flag_value(awq_m1)
    env[config.VLLM_PLUGINS.name] = plugin_allow_list(
        base_env.get(config.VLLM_PLUGINS.name),
        include_plugin=include_plugin,
        installed=installed_plugins,
    )
    env[config.REPORT_DIR.name] = str(report_dir)
    return env


# The variables `up` sets whatever the caller's environment says, and why.
_OWNED_ENV = {
    config.ROUTE_FLAG.name: "--awq-m1/--no-awq-m1 decide the route",
    config.REPORT_DIR.name: "up reads the route reports there",
}


def replaced_env(base_env: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """One line per variable the user set that the server gets with another value. A route
    flag no host accepts is not replaced but refused: the preflight FAILs it (prestart.py)."""
    return [
        f"note: {name}={base_env[name]} in your environment is replaced by {env[name]} ({why})"
        for name, why in _OWNED_ENV.items()
        if name in base_env
        and base_env[name] != env.get(name)
        and (name != config.ROUTE_FLAG.name or base_env[name] in config.ROUTE_FLAG_VALUES)
    ]


# Recorded in the running state and shown by --dry-run: what decides the route and the devices,
# and a native host's grouped decode route, which takes the same MoE layers (qpnserve.host_routes).
RECORDED_ENV = (
    config.ROUTE_FLAG.name,
    config.VLLM_PLUGINS.name,
    config.REPORT_DIR.name,
    "CUDA_VISIBLE_DEVICES",
    *GROUPED_ROUTE_NAMES,
)


def route_env_record(env: Mapping[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in RECORDED_ENV}


def installed_general_plugins() -> list[str]:
    """Names of the vllm.general_plugins entry points installed in this Python (ours included)."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group="vllm.general_plugins")})


def port_in_use(host: str, port: int) -> bool:
    """True if nothing can bind (host, port). SO_REUSEADDR as servers use it: TIME_WAIT is free."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            return True
    return False


def port_holder(port: int) -> str | None:
    """'pid N (cmd)' of the process listening on ``port``, when /proc lets us see it."""
    pid = port_holder_pid(port)
    if pid is None:
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        cmd = "?"
    return f"pid {pid} ({cmd[:120]})"


def port_holder_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` here, when /proc lets us see it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"  # LISTEN
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(proc.name)
        except OSError:
            continue
    return None


def start_server(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start the server in a new session (its own process group) with stdout+stderr to the log.

    A new session means the terminal's Ctrl-C does not reach the workers directly: qpnserve
    stops the whole group itself, gracefully, so no TP worker is left holding a GPU.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise ServerError(
            f"cannot start {argv[0]}: {exc.strerror or exc}",
            hint="check that the Python running qpnserve is the host's (the one with vLLM)",
        ) from None
    finally:
        os.close(fd)


def default_python() -> str:
    return sys.executable
