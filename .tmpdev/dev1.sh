python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb QPNSERVE_GIT_COMMIT=$(git rev-parse --short HEAD)+w2bulk
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
time python3 -m qpnserve build --json > $OUT/build.json 2>&1; tail -c 300 $OUT/build.json
for f in 4byte 3byte; do for p in auto polled-w2-bulk polled-w2-bulk-late; do
python3 -m qpnserve bench op --format $f --op-path $p --layers 32 --iters 40 --rounds 2 --json > $OUT/b_${f}_$p.json 2>/tmp/e.txt || tail -3 /tmp/e.txt
python3 -c "import json;d=json.load(open('$OUT/b_${f}_$p.json'));r=d['ratios'];print('$f $p op %.3f floor %.3f ratio %.3f empty %.2f'%(d['op']['net_us'],d['floor']['net_us'],r['op_to_floor'],d['empty_routes']['op_net_us']))"
done; done
timeout 150 python3 -m pytest -m gpu tests/kernels -q -x -k "w2_bulk" -p no:cacheprovider 2>&1 | tail -3
