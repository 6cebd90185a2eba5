"""The stages the lifecycle tests run `up` with.

Preflight is the REAL one, deciding on the hand-written facts of a healthy 4x V100 host
(tests/data/facts_v100_ok.json, via $QPNSERVE_FACTS_FILE) and a synthetic checkpoint. The build
stage compiles nothing (there is no CUDA here); its build key says so, so nothing downstream
can mistake it for a real build.
"""

from __future__ import annotations

from qpnserve.config import Settings
from qpnserve.host import HostInfo
from qpnserve.lifecycle import stages
from qpnserve.lifecycle.options import Progress
from qpnserve.lifecycle.stages import Stages, run_preflight_stage

TEST_BUILD_KEY = "test-no-build"


def no_build(host: HostInfo, progress: Progress, settings: Settings) -> str:
    progress(f"extension: not built ({TEST_BUILD_KEY}: lifecycle test, no CUDA)")
    return TEST_BUILD_KEY


def test_stages() -> Stages:
    return Stages(preflight=run_preflight_stage, prepare_extension=no_build)


test_stages.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def install() -> None:
    stages.default_stages = test_stages  # type: ignore[assignment]
