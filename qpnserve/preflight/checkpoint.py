"""The checkpoint probe: config.json, the safetensors index, and every shard's header, read once
into a frozen CheckpointFacts with the layout derived from them (layout.read_layout).

Header-only: safetensors' ``safe_open`` maps the file and parses the header; ``get_slice``
gives dtype and shape without touching the data, so a 60 GB checkpoint is scanned in about a
second. Every problem is recorded as a fact (an error string), never raised.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qpnserve.preflight import layout
from qpnserve.preflight.facts import CheckpointFacts, ShardFacts

INDEX_NAME = "model.safetensors.index.json"
# The layer prefix is told from the first tensor names read: enough without walking all
# 221,184 expert tensors of the full model.
PREFIX_SAMPLE = 64


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

    if not path.is_file():
        return ShardFacts(file=path.name, exists=False, error="missing")
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
        return ShardFacts(file=path.name, exists=True, error=text)
    return ShardFacts(file=path.name, exists=True, header_ok=True, num_tensors=len(names))


def _read_config(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """config.json as parsed, or None and why not."""
    config, error = _read_json(path / "config.json")
    if error is None and not isinstance(config, dict):
        error = "config.json is not a JSON object"
    return (config if isinstance(config, dict) else None), error


@dataclass(frozen=True)
class _Index:
    file: str | None  # INDEX_NAME, or None (no index: every *.safetensors file is a shard)
    error: str | None
    weight_map: dict[str, str]  # tensor -> shard file; empty without a readable index
    shard_files: list[str]
    unindexed_files: list[str]  # *.safetensors files on disk that a readable index never names


def _read_index(path: Path, entries: list[str]) -> _Index:
    on_disk = [e for e in entries if e.endswith(".safetensors")]
    if INDEX_NAME not in entries:
        return _Index(None, None, {}, on_disk, [])
    index, error = _read_json(path / INDEX_NAME)
    raw_map = index.get("weight_map") if isinstance(index, dict) else None
    if error is None and not (
        isinstance(raw_map, dict) and all(isinstance(v, str) for v in raw_map.values())
    ):
        error = f"{INDEX_NAME} has no weight_map of tensor -> shard file"
    weight_map = raw_map if error is None and isinstance(raw_map, dict) else {}
    shard_files = sorted(set(weight_map.values()))
    unindexed = sorted(e for e in on_disk if e not in set(shard_files)) if error is None else []
    return _Index(INDEX_NAME, error, weight_map, shard_files, unindexed)


def probe_checkpoint(path: Path) -> CheckpointFacts:
    """Read the checkpoint once (config.json, the index, every shard's header) and derive its
    layout once, into one frozen record; the checks only read that record."""
    where = str(path)
    if not path.exists():
        return CheckpointFacts(path=where, error="does not exist")
    if not path.is_dir():
        return CheckpointFacts(
            path=where, exists=True, error="is not a directory (pass the checkpoint directory)"
        )
    try:
        entries = sorted(os.listdir(path))
    except OSError as exc:
        return CheckpointFacts(
            path=where, exists=True, is_dir=True, error=f"cannot list it: {exc.strerror or exc}"
        )
    config, config_error = _read_config(path)
    index = _read_index(path, entries)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    shards = [_scan_shard(path / name, tensors) for name in index.shard_files]
    prefix_sample = list(itertools.islice(tensors, PREFIX_SAMPLE))
    return CheckpointFacts(
        path=where,
        exists=True,
        is_dir=True,
        readable=True,
        config=config,
        config_error=config_error,
        index_file=index.file,
        index_error=index.error,
        shards=shards,
        unindexed_files=index.unindexed_files,
        num_tensors=len(tensors),
        layout=layout.read_layout(config, prefix_sample) if config is not None else None,
        tensors=tensors,
        index_weight_map=index.weight_map,
    )
