python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb QPNSERVE_GIT_COMMIT=$(git rev-parse --short HEAD)+zc
python3 -m qpnserve build --json > $OUT/build6.json 2>&1; tail -c 60 $OUT/build6.json
for r in 1 2; do for f in 4byte 3byte; do for p in auto polled-zero-cols; do
python3 -m qpnserve bench op --format $f --op-path $p --layers 32 --iters 40 --rounds 2 --json > $OUT/b6_${f}_${p}_$r.json 2>/tmp/e.txt || tail -3 /tmp/e.txt
python3 -c "import json;d=json.load(open('$OUT/b6_${f}_${p}_$r.json'));r=d['ratios'];print('$r $f $p op %.3f floor %.3f ratio %.3f clk %s'%(d['op']['net_us'],d['floor']['net_us'],r['op_to_floor'],d['device']['sm_clock_mhz']))"
done; done; done
timeout 100 python3 -m pytest -m gpu tests/kernels -q -x -k "zero_cols" -p no:cacheprovider 2>&1 | tail -2
cd scripts && timeout 150 python3 op_trace.py --derive --layers 32 --replays 20 --format 4byte --paths auto,polled-zero-cols --build-dir /tmp/qtrace > $OUT/trace6.log 2>&1; grep -E "^4byte|out stored|h stored  |SM clock" $OUT/trace6.log | cut -c1-110
