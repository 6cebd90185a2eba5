#!/usr/bin/env bash
# The evidence run on a GPU machine (used on one H200): build once, the GPU tests, `bench op`
# for both metadata formats with the device's default path and with the V100 design on this GPU
# (`--op-path v100`: its correctness here and its time on this GPU, not a V100 speed). Run from
# the repository root; results go to $OUT (default ./.out).
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
export QPNSERVE_GIT_COMMIT=${QPNSERVE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
step() { echo; echo "=== $(date +%T) $*"; }
step build; timeout 200 python3 -m qpnserve build --json >"$OUT/build.json"; echo "rc=$?"
step "gpu tests"
timeout 300 python3 -m pytest -m gpu tests/kernels tests/bench_op tests/dispatch -q \
  >"$OUT/gpu_tests.log" 2>&1; echo "rc=$?"
grep -E "FAILED|Fatal|passed|failed" "$OUT/gpu_tests.log" | tail -5
for fmt in 4byte 3byte; do
  for path in auto v100; do
    step "bench op $fmt --op-path $path"
    timeout 120 python3 -m qpnserve bench op --format "$fmt" --op-path "$path" --layers 32 \
      --iters 40 --rounds 2 --json >"$OUT/bench_op_${fmt}_$path.json" 2>"$OUT/bench_op_${fmt}_$path.log"
    echo "rc=$?"
    tail -12 "$OUT/bench_op_${fmt}_$path.log"
  done
done
step done
