"""The real ReVolta 0.1.4 wheel (a native host on the registry), unpacked, never imported.

The wheel is fetched by name with pip (``pip download --no-deps --only-binary=:all:
--python-version 3.12 revolta==0.1.4``; about 80 MB, a Python 3.12 wheel that the test Python
need not match) into a cache that later runs reuse: $QPNSERVE_TEST_WHEEL_CACHE, else
``<user cache dir>/qpnserve-tests/wheels``. Its ``vllm/`` tree and dist-info are unzipped into a
temporary site directory, which the tests hand to qpnserve's detection as a search path.

Under CI (CI=true) a wheel that cannot be fetched fails the tests: they are the record that
qpnserve reads the real host right. Elsewhere (no network) they skip with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NoReturn

import pytest

REQUIREMENT = "revolta==0.1.4"
WHEEL_GLOB = "revolta-0.1.4-*.whl"
UNPACKED = ("vllm/", "revolta-0.1.4.dist-info/")
CACHE_VAR = "QPNSERVE_TEST_WHEEL_CACHE"
DOWNLOAD_TIMEOUT_S = 600.0


def wheel_cache_dir() -> Path:
    override = os.environ.get(CACHE_VAR)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qpnserve-tests" / "wheels"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{reason} (CI=true: the real-host tests must run)", pytrace=False)
    pytest.skip(reason)


def _download(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--disable-pip-version-check", "--quiet",
        "--dest", str(cache), REQUIREMENT,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"pip download {REQUIREMENT} did not finish: {exc}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        _unavailable(f"pip download {REQUIREMENT} failed (exit {done.returncode}): {last}")


@pytest.fixture(scope="session")
def revolta_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding ReVolta 0.1.4's ``vllm/`` and its dist-info, as installed."""
    cache = wheel_cache_dir()
    if not sorted(cache.glob(WHEEL_GLOB)):
        _download(cache)
    wheels = sorted(cache.glob(WHEEL_GLOB))
    if not wheels:
        _unavailable(f"pip download {REQUIREMENT} left no {WHEEL_GLOB} in {cache}")
    site = tmp_path_factory.mktemp("revolta-site")
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(site, [n for n in wheel.namelist() if n.startswith(UNPACKED)])
    except (OSError, zipfile.BadZipFile) as exc:
        _unavailable(f"{wheels[0]} cannot be unpacked ({exc}); delete it to fetch it again")
    return site


@pytest.fixture(scope="session")
def revolta_vllm(revolta_site: Path) -> Path:
    return revolta_site / "vllm"
