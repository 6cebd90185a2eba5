"""Gathering the facts: probe this machine once, or read them from a recorded file.

$QPNSERVE_FACTS_FILE replaces the machine probes (gpu, torch, nvcc, host, and env when the file
has it) with the facts it holds, recorded or hand-written; the checkpoint is still probed from
``--model``. Imports run one way: gather -> probes/checkpoint -> facts.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from qpnserve.config import FACTS_FILE
from qpnserve.errors import UsageError
from qpnserve.host import HostInfo
from qpnserve.preflight import probes
from qpnserve.preflight.checkpoint import probe_checkpoint
from qpnserve.preflight.facts import Facts


def load_facts_file(path: Path) -> Facts:
    """Recorded facts. A missing or malformed file is a usage error (exit 2), never a guess."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        facts = Facts.model_validate(data)
    except OSError as exc:
        raise UsageError(
            f"cannot read {FACTS_FILE.name}={path}: {exc.strerror or exc}",
            hint=f"unset {FACTS_FILE.name} to probe this machine",
        ) from None
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(
            f"{FACTS_FILE.name}={path} is not a facts file: {first}",
            hint="record one with `qpnserve check --json` and keep its `facts` object",
        ) from None
    return facts.model_copy(update={"source": "recorded", "source_file": str(path)})


# The facts each machine group decides on; `env` is optional (the current environment is
# read when the file has none).
_GROUP_FACTS = {"gpu": ("gpu",), "toolchain": ("torch", "nvcc", "host")}


def _require_recorded(facts: Facts, groups: set[str], path: Path) -> None:
    """A facts file stands in for the machine only with what it holds: a group whose facts it
    lacks would otherwise SKIP every check and pass, having examined nothing."""
    missing = [
        key
        for group, keys in _GROUP_FACTS.items()
        if group in groups
        for key in keys
        if getattr(facts, key) is None
    ]
    if missing:
        raise UsageError(
            f"{FACTS_FILE.name}={path} holds no {', '.join(missing)} facts, so it cannot stand "
            "in for this machine",
            hint="record the facts with `qpnserve check --json` on the machine and keep its "
            "`facts` object, pass --only for the groups the file holds, or unset "
            f"{FACTS_FILE.name}",
        )


def host_facts(facts_file: Path | None) -> HostInfo:
    """The installed host as `up` will see it: from ``facts_file`` ($QPNSERVE_FACTS_FILE) when
    set (it must record the toolchain facts), else probed from the installed files."""
    if facts_file is not None:
        recorded = load_facts_file(facts_file)
        _require_recorded(recorded, {"toolchain"}, facts_file)
        assert recorded.host is not None
        return recorded.host
    return probes.probe_host()


def gather_facts(
    model: Path | None,
    groups: set[str],
    facts_file: Path | None,
    environ: Mapping[str, str],
) -> Facts:
    """Probe what ``groups`` need, once. With ``facts_file`` ($QPNSERVE_FACTS_FILE) the machine
    facts come from that file; the checkpoint is always probed from ``model``. ``environ``: the
    environment to judge (the server's for `up`, the settings' snapshot for `check`); the GPU
    and nvcc probes read CUDA_VISIBLE_DEVICES, CUDA_HOME, CUDA_PATH and PATH from it too."""
    env = dict(environ)
    if facts_file is not None:
        facts = load_facts_file(facts_file)
        _require_recorded(facts, groups, facts_file)
        # Keep only what the chosen groups use, as a probe would.
        if "gpu" not in groups:
            facts.gpu = None
        if "toolchain" not in groups:
            facts.torch = facts.nvcc = facts.host = facts.env = None
        elif facts.env is None:
            facts.env = probes.probe_env(env)
        facts.checkpoint = None
    else:
        facts = Facts(hostname=platform.node())
        if "gpu" in groups:
            facts.gpu = probes.probe_gpu(env)
        if "toolchain" in groups:
            facts.torch = probes.probe_torch()
            facts.nvcc = probes.probe_nvcc(env)
            facts.host = probes.probe_host()
            facts.env = probes.probe_env(env)
    if "checkpoint" in groups and model is not None:
        facts.checkpoint = probe_checkpoint(model)
    return facts
