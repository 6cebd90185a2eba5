"""The V100 design's grid barrier errors instead of hanging a rank (run with -m gpu).

The bench extension's barrier_probe runs the operator's grid_barrier_arrive / grid_barrier_wait
alone (csrc/bench_trace.cu): completed, in an ordinary launch (no cooperative workspace: a null
workspace traps at once) and with one CTA that never arrives (the others trap after their poll
bound, 2^20 in the probe, 2^26 in the operator). A trap poisons the CUDA context, so each case
runs in a child process, bounded in time: a hang fails the test instead of the session.
"""

from __future__ import annotations

import pytest

from tests.kernels.opcases import run_child

pytestmark = pytest.mark.gpu

_PROBE = """
import sys
import torch
torch.ops.load_library(sys.argv[1])
try:
    torch.ops.qpnserve_bench.barrier_probe(int(sys.argv[2]))
    torch.cuda.synchronize()
except RuntimeError as exc:
    print("cuda error:", str(exc).splitlines()[0], flush=True)
    sys.exit(3)
print("completed", flush=True)
"""


@pytest.fixture(scope="module")
def bench_library(bench_extension):  # type: ignore[no-untyped-def]
    return bench_extension.path


@pytest.mark.parametrize("mode", [0, 3], ids=["design-barrier", "alternating-with-cg-sync"])
def test_gpu_barrier_completes_when_every_cta_arrives(bench_library, mode: int) -> None:  # type: ignore[no-untyped-def]
    # Mode 3 alternates the design's barrier with cooperative_groups::this_grid().sync() on the
    # same workspace: both complete only if they keep one protocol.
    done = run_child(_PROBE, bench_library, mode, timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr[-1500:]
    assert done.stdout.strip().endswith("completed")


@pytest.mark.parametrize(
    ("mode", "reason"),
    [(1, "no cooperative-launch workspace"), (2, "never reached the grid barrier")],
    ids=["not-cooperative", "cta-never-arrives"],
)
def test_gpu_broken_barrier_traps_naming_the_op_and_the_rollback(
    bench_library,  # type: ignore[no-untyped-def]
    mode: int,
    reason: str,
) -> None:
    done = run_child(_PROBE, bench_library, mode, timeout_s=120)
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-2000:]
    assert "cuda error:" in done.stdout
    assert "qpnserve awq_moe_m1_out" in output and reason in output, output[-2000:]
    assert "qpnserve rollback --restart" in output
