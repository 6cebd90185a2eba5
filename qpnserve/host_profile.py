"""A native host's own launch profile, and which of qpnserve's launch defaults give way to it.

ReVolta 0.1.4 applies a V100 serving profile inside the server process
(``vllm/revolta_profile.py``): when every visible GPU is SM70, the tensor-parallel size is 4,
the model dtype is float16 and the checkpoint declares sparse-attention selector metadata
(text config ``indexer_n_heads``, ``indexer_kv_heads``, ``indexer_head_dim``,
``indexer_budget``, ``indexer_compress_ratio`` positive integers, and a ``layer_types`` entry
``full_attention`` or ``qwen_sparse_attention``), it writes environment values into its own
``os.environ``: a common set, an AWQ set for an AWQ checkpoint (the route flag and the grouped
route among them; a DFlash variant with ``--speculative-config`` method ``dflash``), and a
custom all-reduce value unless the interconnect is NCCL-only (``VLLM_SM70_INTERCONNECT=nccl`` or
``--disable-custom-all-reduce``). A value already in the environment always wins. It sets no
engine argument (only one kernel-config field of its own). tests/real_host checks these claims
against the real wheel, by executing the module.

``LAUNCH_DEFAULTS`` is the one table of what happens to each of qpnserve's launch defaults on a
host with that profile; the launch (lifecycle/launch.py) and `up --dry-run` read it, and
docs/operator.md mirrors it. Everything here reads files (``ast``), never imports vllm.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qpnserve.config import REPORT_DIR, ROUTE_FLAG, VLLM_PLUGINS

PROFILE_FILE = "revolta_profile.py"  # inside the installed ``vllm`` package
PROVENANCE_VAR = "VLLM_REVOLTA_PROFILE_PROVENANCE"

Decision = Literal["stays", "gives way"]


@dataclass(frozen=True)
class LaunchDefaultRule:
    key: str  # an option's family key ("dtype", from launch.option_key) or a variable's name
    kind: Literal["argument", "environment"]
    profile_writes: str | None  # what ReVolta 0.1.4's profile writes for it; None: nothing
    decision: Decision  # on a host with the profile
    why: str


_NO_ARGS = "the profile sets no engine argument"
LAUNCH_DEFAULTS: tuple[LaunchDefaultRule, ...] = (
    LaunchDefaultRule("trust-remote-code", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule(
        "dtype", "argument", None, "stays",
        f"{_NO_ARGS}; float16 is one of its conditions (V100 has no bf16), so it stays to let "
        "the profile apply",
    ),
    LaunchDefaultRule("attention-backend", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("gpu-memory-utilization", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("max-model-len", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("max-num-seqs", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("max-num-batched-tokens", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("enable-prefix-caching", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule("limit-mm-per-prompt", "argument", None, "stays", _NO_ARGS),
    LaunchDefaultRule(
        ROUTE_FLAG.name, "environment", "1", "stays",
        "the profile writes the same 1 (AWQ checkpoints), and leaves `--no-awq-m1`'s explicit 0 "
        "alone; written also where the profile does not apply, where unset would mean on with a "
        "silent fallback instead of failing closed",
    ),
    LaunchDefaultRule(VLLM_PLUGINS.name, "environment", None, "stays", "not in the profile"),
    LaunchDefaultRule(REPORT_DIR.name, "environment", None, "stays", "not in the profile"),
)  # fmt: skip


def rule_for(key: str) -> LaunchDefaultRule | None:
    return next((rule for rule in LAUNCH_DEFAULTS if rule.key == key), None)


def gives_way(key: str, *, host_has_profile: bool) -> bool:
    """Whether qpnserve leaves its default ``key`` out because the host's profile supplies it."""
    rule = rule_for(key)
    return host_has_profile and rule is not None and rule.decision == "gives way"


# ---- the profile's tables, as the installed host's file states them

# The tables that decide what the profile writes (ReVolta 0.1.4's names).
PROFILE_TABLES = (
    "COMMON_DEFAULTS",
    "AWQ_DEFAULTS",
    "AWQ_DFLASH_DEFAULTS",
    "NVFP4_DEFAULTS",
    "CUSTOM_AR_DEFAULTS",
)


@dataclass(frozen=True)
class ProfileTables:
    path: Path
    tables: dict[str, dict[str, str]]  # table name -> {variable: value}


class ProfileUnreadable(ValueError):
    """The file is there but not in the layout this qpnserve knows (ReVolta 0.1.4's)."""


def profile_path(package_dir: str | Path | None) -> Path | None:
    if package_dir is None:
        return None
    path = Path(package_dir) / PROFILE_FILE
    return path if path.is_file() else None


def read_profile_tables(path: Path) -> ProfileTables:
    """The module-level ``NAME = {"VAR": "value", ...}`` tables of ``PROFILE_TABLES``."""
    try:
        tree = ast.parse(path.read_text("utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise ProfileUnreadable(f"{path}: {exc}") from None
    tables: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id in PROFILE_TABLES):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        if isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            tables[target.id] = value
    missing = [name for name in ("COMMON_DEFAULTS", "AWQ_DEFAULTS") if name not in tables]
    if missing:
        raise ProfileUnreadable(f"{path}: no literal {', '.join(missing)} table")
    return ProfileTables(path, tables)


def installed_profile(package_dir: str | Path | None) -> ProfileTables | None:
    """The installed host's profile tables; None when the host has no profile file."""
    path = profile_path(package_dir)
    return None if path is None else read_profile_tables(path)


def read_model_config(model: Path) -> dict[str, object] | None:
    """``config.json`` of a checkpoint, or None when it cannot be read."""
    try:
        loaded = json.loads((model / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def last_option(argv: Sequence[str], key: str) -> str | None:
    """The value the server takes for ``--key`` (its last spelling wins, as argparse does)."""
    found: str | None = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if not name.startswith("--") or name[2:].replace("_", "-") != key:
            continue
        if eq:
            found = inline
        elif i + 1 < len(argv):
            found = argv[i + 1]
    return found


def has_flag(argv: Sequence[str], key: str) -> bool:
    return any(a.split("=", 1)[0].replace("_", "-") == f"--{key}" for a in argv)
