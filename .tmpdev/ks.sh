set -e
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
nvcc --version | tail -1
nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/ksplit.cu -o /tmp/ksplit
/tmp/ksplit | tee $OUT/ksplit.log

