"""The checkpoint's exported AWQ tensors, read as stored (no repacking, no host involved).

Per expert and projection (AWQ GEMM packing, contract section 1): qweight (K, N/8) int32,
qzeros (K/32, N/8) int32, scales (K/32, N) float16; gate_proj and up_proj map hidden 2560 ->
moe_intermediate 640, down_proj maps 640 -> 2560. Reads only the experts asked for, through
safetensors' memory map (numpy; torch is not needed to read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qpnserve import geometry
from qpnserve.errors import QpnError, UsageError
from qpnserve.preflight import layout

INDEX_NAME = "model.safetensors.index.json"
PROJS = ("gate_proj", "up_proj", "down_proj")


class VerifyError(QpnError):
    """verify could not run (an unreadable or unsupported checkpoint): exit 1."""


@dataclass(frozen=True)
class ProjExport:
    qweight: np.ndarray  # (K, N/8) int32, AWQ GEMM nibble order along N
    qzeros: np.ndarray  # (K/32, N/8) int32, same packing
    scales: np.ndarray  # (K/32, N) float16


@dataclass(frozen=True)
class ExpertExport:
    gate: ProjExport  # K = 2560, N = 640
    up: ProjExport  # K = 2560, N = 640
    down: ProjExport  # K = 640, N = 2560


def _expected_shapes() -> dict[str, tuple[int, ...]]:
    specs = layout.expert_tensor_specs()
    return {name: spec.shape for name, spec in specs.items()}


class Checkpoint:
    """A checkpoint directory: config, index, and lazily opened shards."""

    def __init__(self, path: Path) -> None:
        self.path = path
        config = self._json(path / "config.json")
        if not isinstance(config, dict):
            raise VerifyError(f"{path / 'config.json'} is not a JSON object")
        index = self._json(path / INDEX_NAME)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise VerifyError(f"{INDEX_NAME} in {path} has no weight_map")
        self.weight_map: dict[str, str] = weight_map
        # The MoE layers and their prefix as the preflight derives them (one derivation); the
        # prefix is told from every indexed name.
        found = layout.read_layout(config, weight_map)
        quant = found.quantization or {}
        wanted = {"quant_method": "awq", "bits": 4, "group_size": geometry.GROUP}
        for key, value in wanted.items():
            if quant.get(key) != value:
                raise VerifyError(
                    f"{path.name}: quantization_config.{key} is {quant.get(key)!r}, "
                    f"the route needs {value!r}",
                    hint="`qpnserve check --model` lists every requirement",
                )
        if quant.get("zero_point") is False:
            raise VerifyError(f"{path.name}: AWQ without zero points; the route needs them")
        self.moe_layers = list(found.moe_layers)
        self.layer_prefix = found.layer_prefix
        self._shards: dict[str, Any] = {}
        self._shapes = _expected_shapes()

    @staticmethod
    def _json(path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{path} is missing", hint="--model must be a checkpoint") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VerifyError(f"{path} is unreadable: {exc}") from None

    def tensor_name(self, layer: int, expert: int, proj: str, part: str) -> str:
        return f"{layout.expert_prefix(self.layer_prefix, layer)}.{expert}.{proj}.{part}"

    def _read(self, name: str) -> np.ndarray:
        from safetensors import SafetensorError, safe_open

        shard = self.weight_map.get(name)
        if shard is None:
            raise VerifyError(f"{name} is not in the checkpoint's index")
        try:
            handle = self._shards.get(shard)
            if handle is None:
                handle = safe_open(str(self.path / shard), framework="numpy")
                self._shards[shard] = handle
            return np.asarray(handle.get_tensor(name))
        except (SafetensorError, OSError, ValueError) as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise VerifyError(f"reading {name} from {shard} failed: {first}") from None

    def expert(self, layer: int, expert: int) -> ExpertExport:
        parts: dict[str, ProjExport] = {}
        for proj in PROJS:
            arrays = {}
            for part, dtype in (
                ("qweight", np.int32),
                ("qzeros", np.int32),
                ("scales", np.float16),
            ):
                name = self.tensor_name(layer, expert, proj, part)
                array = self._read(name)
                want = self._shapes[f"{proj}.{part}"]
                if array.dtype != dtype or array.shape != want:
                    raise VerifyError(
                        f"{name} is {array.dtype} {tuple(array.shape)}, the route needs "
                        f"{np.dtype(dtype)} {want}"
                    )
                arrays[part] = array
            parts[proj] = ProjExport(**arrays)
        return ExpertExport(gate=parts["gate_proj"], up=parts["up_proj"], down=parts["down_proj"])
