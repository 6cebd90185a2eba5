"""docs/evidence/README.md: every evidence folder has a row, and each row's "cited by" is true.

A row's citers must each name one of the row's folders (a link, or the commit the folder is
named after), and a document that links a folder must be among that folder's citers.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs" / "evidence"
INDEX = EVIDENCE / "README.md"


def _rows() -> list[tuple[list[str], list[str]]]:
    """(folders or files of the row, its citers), for every table row that links evidence."""
    rows = []
    for line in INDEX.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ["):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        items = [name.rstrip("/") for name in re.findall(r"\[([^\]]+)\]\(", cells[0])]
        citers = [c.strip() for c in cells[-1].split(",")]
        rows.append((items, citers))
    return rows


def _citer_path(citer: str) -> Path:
    if citer == "README":
        return ROOT / "README.md"
    if "/" in citer:
        return EVIDENCE / citer
    return ROOT / "docs" / citer


def test_every_evidence_folder_has_a_row() -> None:
    listed = {item for items, _ in _rows() for item in items}
    present = {p.name for p in EVIDENCE.iterdir() if p.name != "README.md"}
    assert present - listed == set()
    assert listed - present == set()


def test_every_citer_names_one_of_its_rows_folders() -> None:
    rows = _rows()
    assert len(rows) >= 20  # the parser found the tables
    wrong = []
    for items, citers in rows:
        for citer in citers:
            path = _citer_path(citer)
            if not path.is_file():
                wrong.append(f"{items}: {citer} is not a file")
            elif not any(item in path.read_text(encoding="utf-8") for item in items):
                wrong.append(f"{items}: {citer} names none of them")
    assert wrong == []


def test_every_document_linking_a_folder_is_among_its_citers() -> None:
    citers_of = {item: set(citers) for items, citers in _rows() for item in items}
    documents = {"README": ROOT / "README.md"}
    documents |= {p.name: p for p in (ROOT / "docs").glob("*.md")}
    missing = []
    for name, path in documents.items():
        for target in set(re.findall(r"evidence/([\w.-]+)", path.read_text(encoding="utf-8"))):
            if target in citers_of and name not in citers_of[target]:
                missing.append(f"{name} links {target}")
    assert missing == []
