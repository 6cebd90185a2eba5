#!/usr/bin/env bash
# The evidence run on a GPU machine (used on one H200): build the operator and the bench
# extension once, the GPU tests, then `bench op` for both metadata formats with its per-CTA
# trace (--trace). The op is the V100 design on every GPU: on a newer GPU these are its
# correctness and its time there, not a V100 speed. Run from the repository root; results go to
# $OUT (default ./.out).
#   QPNSERVE_GIT_COMMIT=<commit> bash scripts/h200_evidence.sh [build] [tests] [bench]
# (no step named: all three). Pass the commit from the machine that holds the history: a copy of
# the tree sent to a GPU host can carry stale git metadata (it once recorded the previous
# commit). The H200 image lacks pydantic/platformdirs: put their wheels in .whl/ (README of the
# device notes) and they are installed to /tmp/site first.
set -u
OUT=${OUT:-.out}
mkdir -p "$OUT"
STEPS=" ${*:-build tests bench} "
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export QPNSERVE_BUILD_DIR=${QPNSERVE_BUILD_DIR:-/tmp/qb} PYTHONUNBUFFERED=1
export QPNSERVE_TEST_BUILD_DIR=$QPNSERVE_BUILD_DIR
export QPNSERVE_GIT_COMMIT=${QPNSERVE_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
step() { echo; echo "=== $(date +%T) $*"; }
if [[ $STEPS == *" build "* ]]; then
  step "build: the operator and the bench extension, side by side"
  timeout 300 python3 -m qpnserve build --json >"$OUT/build.json" 2>"$OUT/build.log" &
  op_pid=$!
  timeout 300 python3 -c "from qpnserve.config import load_settings; from qpnserve.kernels.build import build; print(build(target='bench', progress=print, build_dir=load_settings().build_dir))" \
    >"$OUT/build_bench.log" 2>&1 &
  bench_pid=$!
  wait $op_pid; echo "op rc=$?"; wait $bench_pid; echo "bench rc=$?"
  tail -n 3 "$OUT/build.log" "$OUT/build_bench.log"
  so=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['path'])" "$OUT/build.json" 2>/dev/null)
  [ -n "$so" ] && nm -C "$so" | grep -c -E "read_floor|derive_input|awq_moe_m1_traced" \
    | sed 's/^/floor, derive or traced symbols in the server library: /'
fi
if [[ $STEPS == *" tests "* ]]; then
  step "gpu tests"
  timeout 300 python3 -m pytest -m gpu tests/kernels tests/bench_op tests/dispatch -q -x \
    >"$OUT/gpu_tests.log" 2>&1; echo "rc=$?"
  grep -E "FAILED|Error|passed|failed" "$OUT/gpu_tests.log" | tail -8
fi
if [[ $STEPS == *" bench "* ]]; then
  for fmt in 4byte 3byte; do
    step "bench op --format $fmt --json --trace"
    timeout 150 python3 -m qpnserve bench op --format "$fmt" --layers 32 --iters 40 --rounds 2 \
      --json --trace "$OUT/trace_$fmt.json" >"$OUT/bench_op_$fmt.json" 2>"$OUT/bench_op_$fmt.log"
    echo "rc=$?"
    tail -14 "$OUT/bench_op_$fmt.log"
  done
fi
step done
