"""Shared fixtures: recorded facts files, a clean route environment, small generated checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from qpnserve.fixtures.checkpoint import write_checkpoint

DATA = Path(__file__).resolve().parent.parent / "data"
V100_OK = DATA / "facts_v100_ok.json"
H200_CU130 = DATA / "facts_h200_cu130.json"
SMALL_LAYERS = 3  # enough for first/middle/last-layer variants, fast to scan


@pytest.fixture(autouse=True)
def clean_route_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No inherited VLLM_*/CUDA_* or facts-file variable changes a test's outcome."""
    import os

    for name in list(os.environ):
        if name.startswith(("VLLM_", "QPNSERVE_")) or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)


@pytest.fixture
def make_ckpt(tmp_path: Path) -> Callable[..., Path]:
    def make(variant: str = "ok", layers: int = SMALL_LAYERS) -> Path:
        return write_checkpoint(tmp_path / f"ckpt-{variant}", variant, num_layers=layers)

    return make
