#!/usr/bin/env bash
# Issue 40 item 5 on the lent H200: the prefix-sharing workloads against real SGLang 0.5.17 (8B-shaped
# dummy weights, a 65,536-token context), by prefix_real_vs_sim.py beside this file. From the checkout root:
#   call 1, carrying .sglkit/kit .sglkit/p1:   bash .sglkit/kit/install.sh
#   call 2, right after, carrying .sglkit/kit .sglkit/p2:   bash benchmarks/sglang-h200/prefix/device.sh
# What comes back under $OUT: device.log, machine.txt, real.jsonl (one line per measurement, written as it
# goes) and each launch's server log (server-<config>.log). BUDGET_S (default 560): this script's deadline.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache TRITON_CACHE_DIR=/tmp/triton-cache
T0=$(date +%s); BUDGET_S=${BUDGET_S:-560}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/device.log
say() { echo "[device +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

bash .sglkit/kit/install.sh --require >> "$LOG" 2>&1 || { say "install.sh --require failed (parts missing?)"; tail -5 "$LOG"; exit 4; }
say "bundle installed"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version
  lscpu | grep -E "^(Model name|CPU\(s\)):"
  PYTHONPATH=/tmp/site python3 -c 'import importlib.metadata as m; print(*(f"{p} {m.version(p)}" for p in ("torch", "sglang", "sglang-kernel", "transformers")))'; } > "$OUT/machine.txt" 2>&1
PYTHONPATH=/tmp/site python3 .sglkit/kit/make_model.py skeleton --out /tmp/model-8b --size 8b >> "$LOG" 2>&1 || { say "no model"; exit 3; }
# The sessions' third turn sends 31,000 tokens and asks 1,000: raise the context (dummy weights, no rope scaling).
python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["max_position_embeddings"] = 65536; json.dump(c, open(p, "w"), indent=1)' /tmp/model-8b/config.json
say "model folder /tmp/model-8b (Llama-3-8B shape, 32k vocab, context 65536; weights --load-format dummy)"
left=$(( BUDGET_S - ($(date +%s) - T0) ))
PYTHONPATH=$PWD:/tmp/site timeout "$left" python3 benchmarks/sglang-h200/prefix/prefix_real_vs_sim.py real \
  --model /tmp/model-8b --out "$OUT/real.jsonl" --logs "$OUT" --budget-s $(( left - 15 )) >> "$LOG" 2>&1
say "done (exit $?)"
cat "$LOG"
