python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb
python3 -m qpnserve build --json > $OUT/build3.json 2>&1; tail -c 60 $OUT/build3.json
python3 scripts/op_timing.py --derive --layers 32 --iters 100 --rounds 3 --paths auto --all-formats --diag floor,floor-w13,derive-only,launch-only,polled-A-only,polled-A-load-only,polled-B-load-only,polled-bare 2>&1 | tee $OUT/op_timing3.log | tail -24
python3 scripts/op_timing.py --derive --layers 32 --iters 100 --rounds 3 --paths auto --all-formats --diag floor,polled-A-load-only,polled-B-load-only,polled-bare 2>&1 | tee $OUT/op_timing3b.log | tail -12
