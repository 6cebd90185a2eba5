"""Find the shipped csrc/ and patches/ folders in a source checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

from qpnserve.errors import QpnError

_PACKAGE_DIR = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the folder ``name`` ("csrc" or "patches").

    A wheel carries them as qpnserve/_data/<name> (hatch force-include); a source checkout has
    them beside the package.
    """
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise QpnError(
        f"the {name}/ folder shipped with qpnserve is missing",
        hint="reinstall qpnserve (pip install --force-reinstall qpnserve)",
    )
