#!/usr/bin/env bash
# Real SGLang start-ups on the lent H200: cold disk against page cache, one loader thread against eight,
# cold JIT caches against warm (startup_h200.py says what each start is). Two device calls:
#   call 1, carrying .sglkit/kit .sglkit/p1:  bash .sglkit/kit/install.sh
#   call 2, carrying .sglkit/kit .sglkit/p2:  bash benchmarks/sglang-h200/startup_h200.sh > /dev/null 2>&1
# What comes back under $OUT: startup_h200.txt (the table), startup_h200.jsonl, machine.txt, run.log and
# the server logs of the starts.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/run.log
say() { echo "[startup_h200 +$(( $(date +%s) - T0 ))s] $*" >> "$LOG"; }
bash .sglkit/kit/install.sh --require >> "$LOG" 2>&1 || { say "install.sh --require failed"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site
M=/tmp/model-8b
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version;
  lscpu | grep -E "^(Model name|CPU\(s\)):"; free -g | head -2; df -h /tmp | tail -1;
  python3 -c 'import torch, sglang; print("torch", torch.__version__, "sglang", sglang.__version__)'; } > "$OUT/machine.txt" 2>&1
say "machine noted"
python3 .sglkit/kit/make_model.py skeleton --out $M --size 8b >> "$LOG" 2>&1 || { say "no skeleton"; exit 3; }
python3 .sglkit/kit/make_model.py weights --model $M >> "$LOG" 2>&1 || { say "no weights"; exit 3; }
sync; say "model written: $(du -sh $M | cut -f1)"
timeout $(( ${BUDGET_S:-575} - ($(date +%s) - T0) )) python3 benchmarks/sglang-h200/startup_h200.py --model $M \
  --out "$OUT" --deadline-s $(( ${BUDGET_S:-575} - 130 - ($(date +%s) - T0) )) >> "$LOG" 2>&1
say "done rc=$?"
