python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb
python3 -m qpnserve build --json > $OUT/build5.json 2>&1; tail -c 60 $OUT/build5.json
python3 scripts/op_timing.py --derive --layers 32 --iters 100 --rounds 3 --paths auto --all-formats --diag floor,derive-only,polled-A-load-only,polled-B-load-only,polled-bare 2>&1 | tee $OUT/op_timing5.log | tail -14
cd scripts && python3 op_trace.py --derive --layers 32 --replays 20 --format 4byte --paths auto,polled-B-load-only,polled-bare --build-dir /tmp/qtrace > $OUT/trace5.log 2>&1; echo rc=$?
grep -E "^4byte|out stored|h stored  |wait over|ready to wait|dots done   " $OUT/trace5.log | cut -c1-110
