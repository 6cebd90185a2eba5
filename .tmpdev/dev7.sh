nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/ksplit.cu -o /tmp/ksplit && /tmp/ksplit > $OUT/ksplit.log 2>&1; grep -v "^    " $OUT/ksplit.log | tail -13
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb
python3 -m qpnserve build --json > $OUT/build.json 2>&1; tail -c 60 $OUT/build.json
for f in 4byte 3byte; do
python3 -m qpnserve bench op --format $f --layers 32 --iters 40 --rounds 2 --json > $OUT/bench_op_$f.json 2>/tmp/e.txt || tail -3 /tmp/e.txt
python3 -c "import json;d=json.load(open('$OUT/bench_op_$f.json'));r=d['ratios'];print('$f op %.3f floor %.3f ratio %.3f clk %s'%(d['op']['net_us'],d['floor']['net_us'],r['op_to_floor'],d['device']['sm_clock_mhz']))"
done
