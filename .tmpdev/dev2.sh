python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb
python3 -m qpnserve build --json > $OUT/build2.json 2>&1; tail -c 120 $OUT/build2.json
python3 scripts/op_timing.py --derive --layers 32 --iters 100 --rounds 3 --paths auto --all-formats --diag floor,floor-w13,derive-only,polled-A-load-only,polled-A-only,A-load-only-w13,polled-w2-bulk 2>&1 | tee $OUT/op_timing2.log | tail -40
