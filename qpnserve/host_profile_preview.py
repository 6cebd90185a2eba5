"""What a host's launch profile will apply to the server `up` is about to start (pure).

The conditions and the merge rule are the ones ReVolta 0.1.4's ``apply_revolta_profile`` uses
(see qpnserve.host_profile; tests/real_host checks them by executing the real module); the
values come from the installed host's own file, as read, never from a list kept here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qpnserve import host_profile
from qpnserve.host_profile import (
    ProfileTables,
    ProfileUnreadable,
    has_flag,
    last_option,
    profile_path,
    read_model_config,
    read_profile_tables,
)

# The sparse-attention selector fields the profile requires, positive integers, in the text
# config; and one of these layer types.
QSA_FIELDS = (
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
)
QSA_LAYER_TYPES = ("full_attention", "qwen_sparse_attention")
FP16_DTYPES = ("float16", "half")
NVFP4_QUANTS = ("modelopt_fp4", "modelopt_mixed")


@dataclass(frozen=True)
class Condition:
    what: str
    met: bool | None  # None: only the server can tell, at start
    detail: str


@dataclass(frozen=True)
class ProfileValue:
    name: str
    profile_value: str  # what the profile would write
    value: str  # what the server gets
    source: Literal["profile", "environment"]  # environment: your explicit value wins


@dataclass(frozen=True)
class ProfilePreview:
    path: str
    applies: bool | None  # None: if the conditions only the server can check hold
    summary: str
    conditions: list[Condition]
    values: list[ProfileValue] = field(default_factory=list)  # empty when it does not apply
    # qpnserve's launch defaults left out for the profile (host_profile.LAUNCH_DEFAULTS).
    left_to_profile: list[str] = field(default_factory=lambda: left_to_profile())


def left_to_profile() -> list[str]:
    return [r.key for r in host_profile.LAUNCH_DEFAULTS if r.decision == "gives way"]


def _text_config(model_config: Mapping[str, object]) -> Mapping[str, object]:
    text = model_config.get("text_config")
    return text if isinstance(text, Mapping) else model_config


def _quantization(argv: Sequence[str], model_config: Mapping[str, object] | None) -> str | None:
    explicit = last_option(argv, "quantization")
    if explicit is not None:
        return explicit
    quant = (model_config or {}).get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    return method if isinstance(method, str) else None


def _speculative_method(argv: Sequence[str]) -> str | None:
    raw = last_option(argv, "speculative-config")
    try:
        method = json.loads(raw).get("method") if raw else None
    except (ValueError, AttributeError):
        return None
    return method if isinstance(method, str) else None


def conditions(argv: Sequence[str], model_config: Mapping[str, object] | None) -> list[Condition]:
    tp = last_option(argv, "tensor-parallel-size")
    dtype = last_option(argv, "dtype")
    dtype_met = None if dtype in (None, "auto") else dtype in FP16_DTYPES
    found: list[Condition] = [
        Condition("every visible GPU is SM70", None, "the server checks it at start"),
        Condition("tensor parallel 4", tp == "4", f"--tensor-parallel-size {tp}"),
        Condition("float16", dtype_met, f"--dtype {dtype or 'unset (the host resolves it)'}"),
    ]
    if model_config is None:
        found.append(Condition("sparse-attention selector metadata", None, "no config.json"))
        return found
    text = _text_config(model_config)
    missing = [
        name
        for name in QSA_FIELDS
        if not (isinstance(text.get(name), int) and int(text[name]) > 0)  # type: ignore[call-overload]
    ]
    layer_types = text.get("layer_types") or ()
    has_type = isinstance(layer_types, list) and any(t in QSA_LAYER_TYPES for t in layer_types)
    detail = "config.json has them"
    if missing:
        detail = f"config.json lacks {', '.join(missing)}"
    elif not has_type:
        detail = f"config.json layer_types has neither {' nor '.join(QSA_LAYER_TYPES)}"
    found.append(Condition("sparse-attention selector metadata", not missing and has_type, detail))
    return found


def preview(
    tables: ProfileTables,
    argv: Sequence[str],
    env: Mapping[str, str],
    model_config: Mapping[str, object] | None,
) -> ProfilePreview:
    """What the profile will write into the server's environment, and which of yours win."""
    found = conditions(argv, model_config)
    failed = [c for c in found if c.met is False]
    if failed:
        reasons = "; ".join(f"{c.what}: {c.detail}" for c in failed)
        return ProfilePreview(str(tables.path), False, f"does not apply ({reasons})", found)
    chosen = dict(tables.tables["COMMON_DEFAULTS"])
    quantization = _quantization(argv, model_config)
    if quantization == "awq":
        chosen.update(tables.tables["AWQ_DEFAULTS"])
        if _speculative_method(argv) == "dflash":
            chosen.update(tables.tables.get("AWQ_DFLASH_DEFAULTS", {}))
    elif quantization in NVFP4_QUANTS:
        chosen.update(tables.tables.get("NVFP4_DEFAULTS", {}))
    nccl_only = env.get("VLLM_SM70_INTERCONNECT", "auto").strip().lower() == "nccl" or has_flag(
        argv, "disable-custom-all-reduce"
    )
    if not nccl_only:
        chosen.update(tables.tables.get("CUSTOM_AR_DEFAULTS", {}))
    values = [
        ProfileValue(name, value, env[name], "environment")
        if name in env
        else ProfileValue(name, value, value, "profile")
        for name, value in chosen.items()
    ]
    unknown = [c.what for c in found if c.met is None]
    summary = "applies" if not unknown else f"applies if: {'; '.join(unknown)}"
    return ProfilePreview(str(tables.path), None if unknown else True, summary, found, values)


def preview_lines(view: ProfilePreview) -> list[str]:
    """`up --dry-run`'s text: one line for the profile, one per value it will write."""
    lines = [f"host launch profile {view.path}: {view.summary}"]
    given = ", ".join(view.left_to_profile) or "none (every one stays, docs/operator.md)"
    lines.append(f"  qpnserve's launch defaults left to the profile: {given}")
    for value in view.values:
        if value.source == "profile":
            lines.append(f"  {value.name}={value.value} (profile)")
        elif value.value == value.profile_value:
            lines.append(f"  {value.name}={value.value} (environment, the profile's value too)")
        else:
            lines.append(
                f"  {value.name}={value.value} (environment, wins over the profile's "
                f"{value.profile_value})"
            )
    return lines


def preview_installed(
    package_dir: str | Path | None, argv: Sequence[str], env: Mapping[str, str]
) -> ProfilePreview | None:
    """The installed host's profile for this launch; None when the host has no profile file."""
    path = profile_path(package_dir)
    if path is None:
        return None
    try:
        tables = read_profile_tables(path)
    except ProfileUnreadable as exc:
        unreadable = f"cannot be read ({exc}): what it applies is unknown"
        return ProfilePreview(str(path), None, unreadable, [])
    model = last_option(argv, "model")
    return preview(tables, argv, env, read_model_config(Path(model)) if model else None)
