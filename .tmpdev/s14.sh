set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts QPNSERVE_BUILD_DIR=/tmp/qb QPNSERVE_TEST_BUILD_DIR=/tmp/qb QPNSERVE_GIT_COMMIT=$(git rev-parse --short HEAD)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
python3 -c "import torch;print(torch.__version__, torch.version.cuda)"; nvcc --version | tail -2
( time python3 -m qpnserve build --json > $OUT/build.json ) 2>&1 | tail -3; tail -c 200 $OUT/build.json; echo
timeout 240 python3 -m pytest -m gpu tests/kernels tests/bench_op tests/dispatch -q -p no:cacheprovider 2>&1 | tail -4
for f in 4byte 3byte; do
python3 -m qpnserve bench op --format $f --layers 32 --iters 40 --rounds 2 --json > $OUT/bench_op_$f.json 2>$OUT/bench_op_$f.txt; echo rc=$?
cat $OUT/bench_op_$f.txt | tail -22
done
