"""The preflight's modules import one way: gather -> probes/checkpoint -> facts.

Read from the source (every import statement, function-level ones included), so an import
hidden inside a function to dodge a cycle counts as an edge too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qpnserve.preflight

PACKAGE = "qpnserve.preflight"
PACKAGE_DIR = Path(qpnserve.preflight.__file__).parent
SUBMODULES = {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}


def _preflight_imports(module: str) -> set[str]:
    """The preflight submodules that ``module`` imports anywhere in its source."""
    tree = ast.parse((PACKAGE_DIR / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found |= {a.name for a in node.names if a.name in SUBMODULES}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    found.discard(module)
    return found


def _graph() -> dict[str, set[str]]:
    return {m: _preflight_imports(m) for m in sorted(SUBMODULES)}


def test_facts_imports_no_other_preflight_module() -> None:
    assert _preflight_imports("facts") == set()


def test_gathering_lives_outside_the_data_models() -> None:
    facts_source = (PACKAGE_DIR / "facts.py").read_text(encoding="utf-8")
    for name in ("def gather_facts", "def load_facts_file", "def host_facts"):
        assert name not in facts_source
    assert {"probes", "checkpoint", "facts"} <= _preflight_imports("gather")


def test_preflight_import_graph_has_no_cycle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
