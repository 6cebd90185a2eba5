"""Render docs/commands.md's environment-variable table from qpnserve.config.ALL_VARS.

Run:  python tools/env_table.py            # print the table
      python tools/env_table.py --write    # replace docs/commands.md's env section with it

tests/preflight/test_env_table.py fails when docs/commands.md's table and ALL_VARS disagree.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qpnserve.config import ALL_VARS

COMMANDS = Path(__file__).resolve().parent.parent / "docs" / "commands.md"
BEGIN, END = "<!-- SECTION:env -->\n", "<!-- /SECTION:env -->"


def render() -> str:
    rows = ["| variable | meaning |", "| --- | --- |"]
    # A bare "|" inside a meaning would end the cell.
    rows += [f"| `{v.name}` | {v.meaning.replace('|', chr(92) + '|')} |" for v in ALL_VARS]
    intro = (
        "Every variable qpnserve reads or sets (`qpnserve/config.py` is the one table; this one\n"
        "is generated from it by `python tools/env_table.py --write`). Options users script\n"
        "read a `QPNSERVE_*` variable; a value on the command line wins.\n"
    )
    return intro + "\n" + "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="docs/commands.md env table from ALL_VARS")
    parser.add_argument("--write", action="store_true", help="rewrite the table in place")
    args = parser.parse_args()
    if not args.write:
        print(render(), end="")
        return 0
    text = COMMANDS.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    COMMANDS.write_text(text[:start] + render() + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
