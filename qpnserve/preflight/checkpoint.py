"""The checkpoint probe: config.json, the safetensors index, and every shard's header.

Header-only: safetensors' ``safe_open`` maps the file and parses the header; ``get_slice``
gives dtype and shape without touching the data, so a 60 GB checkpoint is scanned in about a
second. Every problem is recorded as a fact (an error string), never raised.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from qpnserve.preflight.facts import CheckpointFacts, ShardFacts

INDEX_NAME = "model.safetensors.index.json"


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path.name} is unreadable: {getattr(exc, 'strerror', None) or exc}"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{path.name} is not valid JSON ({exc.msg}, line {exc.lineno})"


def _scan_shard(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> ShardFacts:
    from safetensors import SafetensorError, safe_open

    shard = ShardFacts(file=path.name, exists=path.is_file())
    if not shard.exists:
        shard.error = "missing"
        return shard
    try:
        # framework="numpy": never imports torch; only headers are read.
        with safe_open(str(path), framework="numpy") as f:
            names = f.keys()
            for name in names:
                piece = f.get_slice(name)
                tensors[name] = (piece.get_dtype(), tuple(piece.get_shape()))
    except (SafetensorError, OSError, ValueError, ImportError) as exc:
        # ImportError: safe_open(framework="numpy") without numpy (a broken install).
        text = (str(exc).splitlines() or [repr(exc)])[0].strip("'\"")
        shard.error = text
        return shard
    shard.header_ok = True
    shard.num_tensors = len(names)
    return shard


def probe_checkpoint(path: Path) -> CheckpointFacts:
    facts = CheckpointFacts(path=str(path))
    facts.exists = path.exists()
    if not facts.exists:
        facts.error = "does not exist"
        return facts
    facts.is_dir = path.is_dir()
    if not facts.is_dir:
        facts.error = "is not a directory (pass the checkpoint directory)"
        return facts
    try:
        entries = sorted(os.listdir(path))
    except OSError as exc:
        facts.error = f"cannot list it: {exc.strerror or exc}"
        return facts
    facts.readable = True

    config, facts.config_error = _read_json(path / "config.json")
    if facts.config_error is None and not isinstance(config, dict):
        facts.config_error = "config.json is not a JSON object"
    facts.config = config if isinstance(config, dict) else None

    weight_map: dict[str, str] = {}
    if INDEX_NAME in entries:
        facts.index_file = INDEX_NAME
        index, facts.index_error = _read_json(path / INDEX_NAME)
        raw_map = index.get("weight_map") if isinstance(index, dict) else None
        if facts.index_error is None and not (
            isinstance(raw_map, dict) and all(isinstance(v, str) for v in raw_map.values())
        ):
            facts.index_error = f"{INDEX_NAME} has no weight_map of tensor -> shard file"
        if facts.index_error is None and isinstance(raw_map, dict):
            weight_map = raw_map
        shard_files = sorted(set(weight_map.values()))
    else:
        shard_files = [e for e in entries if e.endswith(".safetensors")]
    facts.index_weight_map = weight_map
    facts.unindexed_files = (
        sorted(e for e in entries if e.endswith(".safetensors") and e not in set(shard_files))
        if facts.index_file and facts.index_error is None
        else []
    )

    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    facts.shards = [_scan_shard(path / name, tensors) for name in shard_files]
    # Assigned after construction so pydantic does not validate hundreds of thousands of rows.
    facts.tensors = tensors
    facts.num_tensors = len(tensors)
    return facts
