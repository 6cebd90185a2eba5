"""The environment-variable table of docs/commands.md lists exactly config.ALL_VARS."""

from __future__ import annotations

import re
from pathlib import Path

from qpnserve.config import ALL_VARS

COMMANDS = Path(__file__).resolve().parents[2] / "docs" / "commands.md"


def env_section() -> str:
    text = COMMANDS.read_text(encoding="utf-8")
    start = text.index("<!-- SECTION:env -->")
    return text[start : text.index("<!-- /SECTION:env -->", start)]


def test_env_table_lists_every_config_variable() -> None:
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", env_section(), flags=re.M))
    names = {v.name for v in ALL_VARS}
    hint = "run: python tools/env_table.py --write"
    assert names - rows == set(), f"missing from docs/commands.md's env table ({hint})"
    assert rows - names == set(), f"in docs/commands.md's env table but not in ALL_VARS ({hint})"
