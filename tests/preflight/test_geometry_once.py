"""The route's geometry is stated once in Python (qpnserve/geometry.py): the preflight and the
checkpoint fixture read it from there instead of writing the numbers again as code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import qpnserve
from qpnserve import geometry

PACKAGE_DIR = Path(qpnserve.__file__).parent
# Numbers distinctive enough that, as an integer in code, they can only be the geometry.
GEOMETRY_NUMBERS = {
    geometry.HIDDEN,
    geometry.NUM_EXPERTS,
    geometry.MOE_INTERMEDIATE,
    geometry.INTERMEDIATE,
    geometry.W13_N,
    geometry.NUM_MOE_LAYERS,
}
MODULES = sorted(
    [*(PACKAGE_DIR / "preflight").glob("*.py"), PACKAGE_DIR / "fixtures" / "checkpoint.py"]
)


def _int_literals(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_module_states_no_geometry_number_as_code(path: Path) -> None:
    assert _int_literals(path) & GEOMETRY_NUMBERS == set()


def test_the_scan_sees_a_geometry_number_written_as_code(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""hidden 2560 in a docstring is fine"""\nHIDDEN = 2560\n')
    assert _int_literals(sample) & GEOMETRY_NUMBERS == {2560}
