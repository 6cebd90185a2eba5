#!/usr/bin/env bash
# The evidence run on a GPU machine (used on one H200): build once, the GPU tests, `bench op`
# for both metadata formats (the default, and a tuning candidate if $CANDIDATE names one), the
# V100 (m8n8k4) path's correctness, the tuning sweep that splits the op's time (with the split and
# waiting two-kernel forms) and the traced timeline of one call. Run from the repository root;
# results go to $OUT (default ./.out).
#   QPNSERVE_GIT_COMMIT=<commit> bash scripts/h200_evidence.sh
# Pass the commit from the machine that holds the history: a copy of the tree sent to a GPU
# host can carry stale git metadata (it once recorded the previous commit).
# The H200 image lacks pydantic/platformdirs: put their wheels in .whl/ (README of the device
# notes) and they are installed to /tmp/site first.
set -u
OUT=${OUT:-.out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export QPNSERVE_BUILD_DIR=${QPNSERVE_BUILD_DIR:-/tmp/qb} PYTHONUNBUFFERED=1
export QPNSERVE_TEST_BUILD_DIR=$QPNSERVE_BUILD_DIR
# A tuning candidate (a `bench op --op-path` name that op_timing.py and op_trace.py also know;
# none by default) and op_timing diags of its parts (comma-separated), timed beside it.
CANDIDATE=${CANDIDATE:-}
PARTS=${PARTS:-}
export QPNSERVE_GIT_COMMIT=${QPNSERVE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
step() { echo; echo "=== $(date +%T) $*"; }
# The tracing build (its own extension, scripts/op_trace.py) compiles meanwhile.
python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'scripts'); import op_trace; \
op_trace.build_traced(Path('/tmp/qt'))" >/tmp/trace_build.log 2>&1 &
step build; timeout 150 python3 -m qpnserve build --json >"$OUT/build.json"; echo "rc=$?"
# Eight files at most come back from the device tool: the three test logs go into one.
for t in tests/kernels tests/dispatch tests/bench_op; do
  step "gpu tests $t"
  echo "=== $t" >>"$OUT/gpu_tests.log"
  timeout 170 python3 -m pytest -m gpu "$t" -v >>"$OUT/gpu_tests.log" 2>&1; echo "rc=$?"
  grep -E "FAILED|Fatal|passed|failed" "$OUT/gpu_tests.log" | tail -3
done
for fmt in 4byte 3byte; do
  step "bench op $fmt"
  timeout 120 python3 -m qpnserve bench op --format "$fmt" --layers 32 --iters 40 --rounds 2 \
    --json >"$OUT/bench_op_$fmt.json"; echo "rc=$?"
  [ -n "$CANDIDATE" ] || continue
  step "bench op $fmt --op-path $CANDIDATE (the tuning candidate)"
  timeout 120 python3 -m qpnserve bench op --format "$fmt" --op-path "$CANDIDATE" --layers 32 \
    --iters 40 --rounds 2 --json >"$OUT/bench_op_${fmt}_candidate.json"; echo "rc=$?"
done
step "bench op mma884 (the V100 path, correctness on this GPU)"
timeout 60 python3 -m qpnserve bench op --op-path mma884 --layers 8 --iters 20 --rounds 1 \
  --json >"$OUT/bench_op_mma884.json"; echo "rc=$?"
step "sweep (graph shaped like bench op's: the derive kernel before every layer)"
timeout 300 python3 scripts/op_timing.py --derive --layers 32 --iters 100 --paths auto \
  --all-formats \
  --diag "derive-only,floor,launch-only${CANDIDATE:+,$CANDIDATE}${PARTS:+,$PARTS},two-kernels,split"
step trace
wait
timeout 200 python3 scripts/op_trace.py --derive --paths "auto${CANDIDATE:+,$CANDIDATE}" \
  --build-dir /tmp/qt
step done
