"""The built wheel: it ships the package and the operator's sources, nothing else, and an
installed (non-editable) copy finds those sources and compiles the operator from them.

The wheel is built the way pip builds it for a user (`pip wheel` through the project's own build
backend, hatchling), offline: `--no-build-isolation` uses the hatchling of the test extra.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# Building the wheel takes a second or two, compiling the operator from it about ten.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# What a wheel may hold: the package (with the operator's sources under qpnserve/_data/) and its
# own metadata folder. Anything else (scripts/, tools/, tests/, docs/, csrc/ at the top level)
# would be research or tooling installed into every user's site-packages.
ALLOWED = re.compile(r"qpnserve/|qpnserve-[^/]+\.dist-info/")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(out.glob("qpnserve-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [n for n in archive.namelist() if not n.endswith("/")]


def _source_files(folder: str) -> list[Path]:
    """The folder's files less what .gitignore keeps out of every build (caches, binaries)."""
    return sorted(
        p
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")
    )


def test_wheel_ships_only_the_package_and_its_metadata(wheel: Path) -> None:
    names = _names(wheel)
    assert names, "the wheel is empty"
    outside = [n for n in names if not ALLOWED.match(n)]
    assert outside == []
    for folder in ("scripts", "tools", "tests", "docs", "examples", "csrc", "patches"):
        assert not any(n.startswith(f"{folder}/") for n in names), folder


def test_wheel_carries_every_module_and_operator_source_unchanged(wheel: Path) -> None:
    expected = {
        f"qpnserve/{p.relative_to(ROOT / 'qpnserve').as_posix()}": p
        for p in _source_files("qpnserve")
    }
    for folder in ("csrc", "patches"):
        for p in _source_files(folder):
            expected[f"qpnserve/_data/{folder}/{p.relative_to(ROOT / folder).as_posix()}"] = p
    # The sources that `qpnserve build` compiles and the manifest the plugin reads, by name, so
    # an emptied csrc/ cannot pass this test.
    assert "qpnserve/_data/csrc/awq_moe_m1.cpp" in expected
    assert "qpnserve/_data/csrc/awq_moe_m1_cuda.cu" in expected
    assert "qpnserve/_data/patches/awq_m1_dispatch.toml" in expected
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        missing = sorted(set(expected) - shipped)
        assert missing == []
        changed = [n for n, p in expected.items() if archive.read(n) != p.read_bytes()]
        assert changed == []


def test_installed_wheel_finds_its_sources_and_compiles_the_operator(
    wheel: Path, tmp_path: Path
) -> None:
    """Unpacked into a bare site directory (what pip install does, without the checkout on the
    path), qpnserve reads csrc/ and patches/ from inside itself and builds the CPU operator."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = dict(os.environ, PYTHONPATH=str(site), QPNSERVE_BUILD_DIR=str(tmp_path / "builds"))
    probe = (
        "import json, qpnserve\n"
        "from qpnserve.resources import resource_dir\n"
        "from qpnserve.dispatch.manifest import load_manifest\n"
        "print(json.dumps({'package': qpnserve.__file__, 'csrc': str(resource_dir('csrc')),\n"
        "    'patches': str(resource_dir('patches')), 'patch_id': load_manifest().id}))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr
    paths = json.loads(found.stdout)
    assert Path(paths["package"]).parent == site / "qpnserve"
    assert Path(paths["csrc"]) == site / "qpnserve" / "_data" / "csrc"
    assert Path(paths["patches"]) == site / "qpnserve" / "_data" / "patches"
    assert paths["patch_id"] == "awq_m1_dispatch"

    built = subprocess.run(
        [sys.executable, "-m", "qpnserve", "build", "--cpu-only", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr
    result = json.loads(built.stdout)
    assert result["reused"] is False
    assert result["with_cuda"] is False
    library = Path(result["path"])
    assert library.is_file() and library.is_relative_to(tmp_path / "builds")
