#!/usr/bin/env bash
# The whole route on a 4x Tesla V100 host with 1Cat-vLLM installed, step by step.
# Run:  MODEL=/path/to/Qwen3.8-AWQ bash examples/v100_awq_m1.sh
# Needs: 4x V100, a torch with sm_70 kernels (1Cat-vLLM ships torch 2.10.0+cu128), a CUDA 12.x
# toolkit (nvcc < 13) for the extension, and a 1Cat-vLLM build (native route or patchable).
# Each step stops the script on failure (set -e) with qpnserve's one-line error and hint.
set -euo pipefail
: "${MODEL:?set MODEL to the checkpoint directory}"

qpnserve check --model "$MODEL"           # preflight: GPUs, toolchain, host, checkpoint
qpnserve build --arch 7.0                 # compile the operator once (cached by sources/torch/CUDA/arch)
qpnserve up --awq-m1 --model "$MODEL" --detach   # start, wait until it serves, verify every rank
qpnserve status                           # desired vs running, route 48/48 layers on 4/4 ranks
qpnserve bench smoke --out smoke-on.json  # C1/C4/C8 pure decode tok/s with the route on

# The A/B of route off vs on, the way the route's evidence was measured:
#   qpnserve bench ab --model "$MODEL"
# Roll back: the next start runs without the route; a running server keeps its CUDA graphs.
#   qpnserve rollback            (then `qpnserve rollback --restart` to apply now)
