"""The environment is read at two edges only: the CLI's root callback and the plugin's register.

Outside qpnserve/config.py (the table and the loader), qpnserve/cli/app.py (the CLI's root
callback, which every command invocation runs first) and qpnserve/plugin.py (vLLM's entry into
every server process), no module may touch ``os.environ``/``os.environb``, call ``os.getenv`` or
``os.putenv``, import ``environ``/``getenv`` from ``os``, or call ``load_settings``: each takes
the ``Settings`` its caller passes down. The scan reads the source (AST), so it also catches a
read that no test happens to execute.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qpnserve"
EDGES = {"config.py", "cli/app.py", "plugin.py"}  # relative to qpnserve/
OS_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}

HOW_TO_FIX = """\
These places read the environment outside the two edges (qpnserve/cli/app.py, qpnserve/plugin.py):
{offenders}
To fix one: add the variable to the table in qpnserve/config.py (an EnvVar with its meaning, in
ALL_VARS), give Settings a typed property for it, and read `settings.<property>` where the value
is needed, taking `settings: Settings` as a parameter from the caller (the CLI commands get it from
`qpnserve.cli.app.settings()`, the plugin from `register`). For a child process, build `env=` from
`settings.environ` (a copy), never from os.environ. Do not call load_settings() there.
"""


def environment_reads(source: str) -> list[str]:
    """Every read of the process environment or call of the settings loader in ``source``."""
    found: list[str] = []
    os_aliases = {"os"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            os_aliases |= {a.asname or a.name for a in node.names if a.name == "os"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            names = sorted(a.name for a in node.names if a.name in OS_NAMES)
            if names:
                found.append(f"line {node.lineno}: from os import {', '.join(names)}")
        elif isinstance(node, ast.Attribute) and node.attr in OS_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id in os_aliases:
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "load_settings":
                found.append(f"line {node.lineno}: load_settings()")
    return found


def test_scanner_finds_every_form_of_environment_read() -> None:
    source = """
import os
import os as system
from os import environ, getenv
from qpnserve import config
a = os.environ.get("X")
b = system.getenv("Y")
c = config.load_settings()
os.environ["Z"] = "1"
"""
    found = environment_reads(source)
    assert "line 4: from os import environ, getenv" in found
    assert "line 6: os.environ" in found
    assert "line 7: system.getenv" in found
    assert "line 8: load_settings()" in found
    assert "line 9: os.environ" in found


def test_scanner_leaves_other_os_use_and_the_word_environ_alone() -> None:
    source = 'import os\nfrom x import environ_of\nos.getpid()\nenv = {"environ": 1}\n'
    assert environment_reads(source) == []


def test_only_the_edges_read_the_environment() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in EDGES:
            continue
        for where in environment_reads(path.read_text(encoding="utf-8")):
            offenders.append(f"  qpnserve/{relative} {where}")
    assert offenders == [], HOW_TO_FIX.format(offenders="\n".join(offenders))


def test_each_edge_builds_its_settings_from_the_loader() -> None:
    for edge in ("cli/app.py", "plugin.py"):
        calls = environment_reads((PACKAGE / edge).read_text(encoding="utf-8"))
        assert any("load_settings()" in c for c in calls), edge
