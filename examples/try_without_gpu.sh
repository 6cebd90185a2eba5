#!/usr/bin/env bash
# What qpnserve does on a machine with no GPU: vet a checkpoint layout, build and run the
# operator's CPU implementation against the FP64 oracle.
# Run:  bash examples/try_without_gpu.sh   (after `pip install -e '.[test]'`, which brings CPU torch)
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A full-size Qwen3.8 AWQ layout (48 layers x 512 experts) with real safetensors headers and
# sparse data: 71.6 GB apparent (as it prints), about 54 MB on disk.
qpnserve fixture checkpoint "$work/ok"
qpnserve check --only checkpoint --model "$work/ok"

# The same layout with group size 128: check names the problem and exits 1.
qpnserve fixture checkpoint "$work/g128" --variant group-128 --layers 2 || true
qpnserve check --only checkpoint --model "$work/g128" || echo "(exit $? as expected)"

# The operator's CPU implementation (the same staged FP16 roundings as the CUDA kernel).
qpnserve build --cpu-only
python3 examples/op_vs_oracle.py
