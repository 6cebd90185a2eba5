"""Each user default is written once, in qpnserve/config.py.

TP 4, the server bound to 127.0.0.1:8000, the 1,800 s readiness deadline and the 60 s stop grace
are what a user gets without options; `up`, `down`, `rollback`, `check`, `bench ab`, the
lifecycle's option records and the state files all default to them. A second copy of one drifts
silently, so outside config.py none of them may be written as the default of a typer option, a
parameter or a record field, nor compared with a ``tp``; the values only a default has (1800,
8000, the default URL) may not be written anywhere else at all. The expected values below are
literals (the README's defaults), never read from config.
"""

from __future__ import annotations

import ast
from pathlib import Path

from qpnserve import config

PACKAGE = Path(__file__).resolve().parents[1] / "qpnserve"

# name of an option/parameter/field -> the default values it must not restate
DEFAULT_BY_NAME: dict[str, tuple[object, ...]] = {
    "tp": (4,),
    "host": ("127.0.0.1",),
    "port": (8000,),
    "timeout_s": (1800.0, 60.0),  # `up`'s deadline, `down`'s grace
    "up_timeout_s": (1800.0,),
    "stop_timeout_s": (60.0,),
    "url": ("http://127.0.0.1:8000",),
}
# Values that are nothing but a default: anywhere outside config.py they are a copy.
ONLY_DEFAULTS: tuple[object, ...] = (1800, 8000, "http://127.0.0.1:8000")


def _default_value(node: ast.expr) -> ast.expr:
    """`typer.Option(X, ...)` / `Field(X)` / `Field(default=X)` -> X; anything else unchanged."""
    if isinstance(node, ast.Call):
        for keyword in node.keywords:
            if keyword.arg == "default":
                return keyword.value
        if node.args:
            return node.args[0]
    return node


def _is_restated(name: str, value: ast.expr) -> bool:
    value = _default_value(value)
    if not isinstance(value, ast.Constant) or isinstance(value.value, bool):
        return False
    return name in DEFAULT_BY_NAME and value.value in DEFAULT_BY_NAME[name]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
    return ids


def restated_defaults(source: str) -> list[str]:
    """Every place in ``source`` that writes one of the user defaults again: 'line N: what'."""
    tree = ast.parse(source)
    found: list[str] = []
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            defaulted = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(defaulted, args.defaults, strict=True))
            pairs += [
                (a, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
            for arg, default in pairs:
                if _is_restated(arg.arg, default):
                    found.append(f"line {default.lineno}: default of parameter {arg.arg}")
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name) and _is_restated(node.target.id, node.value):
                found.append(f"line {node.lineno}: default of field {node.target.id}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = {getattr(s, "attr", getattr(s, "id", "")) for s in sides}
            if "tp" in names and any(
                isinstance(s, ast.Constant) and s.value in DEFAULT_BY_NAME["tp"] for s in sides
            ):
                found.append(f"line {node.lineno}: tp compared with the literal default")
        elif (
            isinstance(node, ast.Constant)
            and id(node) not in docstrings
            and not isinstance(node.value, bool)
            and node.value in ONLY_DEFAULTS
        ):
            found.append(f"line {node.lineno}: literal {node.value!r}")
    return found


def test_config_holds_the_documented_defaults() -> None:
    assert config.DEFAULT_TP == 4
    assert config.DEFAULT_HOST == "127.0.0.1"
    assert config.DEFAULT_PORT == 8000
    assert config.DEFAULT_URL == "http://127.0.0.1:8000"
    assert config.DEFAULT_UP_TIMEOUT_S == 1800.0
    assert config.DEFAULT_STOP_TIMEOUT_S == 60.0


def test_scanner_finds_each_kind_of_restated_default() -> None:
    source = '''
import typer
from dataclasses import dataclass

def up(tp: int = typer.Option(4, "--tp"), port: int = 8000, *, stop_timeout_s=60.0):
    """Docstrings may name 1800 and http://127.0.0.1:8000."""
    return tp != 4

@dataclass
class Options:
    host: str = "127.0.0.1"
    timeout_s: float = 1800.0
    poll_s: float = 60.0
    url: str = Field(default="http://127.0.0.1:8000")
'''
    found = restated_defaults(source)
    assert any("parameter tp" in f for f in found)
    assert any("parameter port" in f for f in found)
    assert any("parameter stop_timeout_s" in f for f in found)
    assert any("tp compared" in f for f in found)
    assert any("field host" in f for f in found)
    assert any("field timeout_s" in f for f in found)
    assert any("field url" in f for f in found)
    assert not any("poll_s" in f for f in found)  # 60.0 under another name is another number
    assert not any(f.startswith("line 6:") for f in found)  # the docstring


def test_scanner_leaves_other_numbers_alone() -> None:
    source = "def f(layers: int = 4, timeout_s: float = 5.0, request_timeout_s=60.0):\n    pass\n"
    assert restated_defaults(source) == []


def test_each_user_default_is_written_only_in_config() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config.py":
            continue
        for where in restated_defaults(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(PACKAGE.parent)} {where}")
    assert offenders == [], (
        "a user default is restated outside qpnserve/config.py; use config.DEFAULT_TP, "
        "DEFAULT_HOST, DEFAULT_PORT, DEFAULT_URL, DEFAULT_UP_TIMEOUT_S or DEFAULT_STOP_TIMEOUT_S "
        "instead:\n" + "\n".join(offenders)
    )
