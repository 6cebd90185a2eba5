"""Session fixtures shared by every test folder: the operator extension, built once.

``cpu_extension`` compiles the C++ CPU implementation (no CUDA needed) into pytest's cache
directory (.pytest_cache/, reused across runs while csrc/ and torch are unchanged) and loads it,
so ``torch.ops.qpnserve.awq_moe_m1_out`` works on CPU tensors. ``cuda_extension`` (gpu tests)
builds for the visible GPUs. A CUDA build also serves the CPU implementation, and only one build
can be loaded per process, so whichever fixture runs first decides.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from qpnserve.config import BUILD_DIR


@contextmanager
def _build_dir(path: Path) -> Iterator[None]:
    saved = os.environ.get(BUILD_DIR.name)
    os.environ[BUILD_DIR.name] = str(path)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(BUILD_DIR.name, None)
        else:
            os.environ[BUILD_DIR.name] = saved


def _test_build_dir(config: pytest.Config) -> Path:
    override = os.environ.get("QPNSERVE_TEST_BUILD_DIR")
    if override:
        return Path(override)
    assert config.cache is not None
    return Path(config.cache.mkdir("qpnserve-extensions"))


@pytest.fixture(scope="session")
def cpu_extension(pytestconfig: pytest.Config):  # -> BuildResult
    """The operator library loaded into this process, with its CPU implementation."""
    from qpnserve.kernels import build

    current = build.loaded()
    if current is not None:
        return current
    with _build_dir(_test_build_dir(pytestconfig)):
        return build.build(cpu_only=True, build_dir=_test_build_dir(pytestconfig))


@pytest.fixture(scope="session")
def cuda_extension(pytestconfig: pytest.Config):  # -> BuildResult
    """A CUDA build for the visible GPUs, loaded (gpu tests only)."""
    import torch

    from qpnserve.kernels import build

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible")
    current = build.loaded()
    if current is not None:
        if not current.with_cuda:
            pytest.fail("a CPU-only build was loaded first; run the gpu tests in their own process")
        return current
    with _build_dir(_test_build_dir(pytestconfig)):
        return build.build(progress=print, build_dir=_test_build_dir(pytestconfig))


@pytest.fixture(scope="session")
def bench_extension(pytestconfig: pytest.Config, cuda_extension):  # -> BuildResult
    """The bench-only extension (floor, derive, traced copy, barrier probe), built beside the
    operator's CUDA build (gpu tests only)."""
    from qpnserve.kernels import build

    with _build_dir(_test_build_dir(pytestconfig)):
        return build.build(target="bench", progress=print, build_dir=_test_build_dir(pytestconfig))
