"""One seeded fixture checkpoint (2 MoE layers, ~170 MB on disk) for the whole verify folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpnserve.fixtures.checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def seeded_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("verify") / "seeded", "seeded", num_layers=2)
