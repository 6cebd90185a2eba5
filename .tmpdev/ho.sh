nvcc -O3 -std=c++17 -arch=sm_90 scripts/microbench/handoff.cu -o /tmp/handoff && /tmp/handoff | tee $OUT/handoff.log && /tmp/handoff | tee $OUT/handoff2.log
