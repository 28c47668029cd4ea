#!/usr/bin/env bash
# SGLang 0.5.17's weight cache daemon on the lent H200 (weight_cache.py says what each step is): a
# disk-loaded server, the daemon, clients at f = 0.85 and at the matched f'. Two device calls, back to back:
#   call 1, carrying .sglkit/kit .sglkit/p1, timeout_s 120:  bash .sglkit/kit/install.sh
#   call 2, carrying .sglkit/kit .sglkit/p2, timeout_s 600:  bash benchmarks/sglang-h200/weight_cache.sh > /dev/null 2>&1
# Call 2 ends within BUDGET_S (575 s) of its start: install 6 s, the 8B model ~60 s, the normal server with
# cold JIT caches ~150 s, the daemon ~40 s, two clients ~75 s each, a third (warm restart) if time is left.
# What comes back under $OUT (8 files): weight_cache.txt (the table), weight_cache.jsonl, run.log,
# machine.txt, server-normal.log, daemon.log, server-client-0.85.log, server-client-fprime.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/run.log; BUDGET_S=${BUDGET_S:-575}
SCRATCH=/tmp/wcache; mkdir -p "$SCRATCH"; : > "$SCRATCH/pgids"
say() { echo "[weight_cache +$(( $(date +%s) - T0 ))s] $*" >> "$LOG"; }
# weight_cache.py stops what it started; this catches what a killed python left (its process groups)
stop_all() {
  local pg
  while read -r pg; do [ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null && say "killed process group $pg"; done < "$SCRATCH/pgids"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$LOG" 2>&1
}
trap stop_all EXIT
bash .sglkit/kit/install.sh --require >> "$LOG" 2>&1 || { say "install.sh --require failed"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site
M=/tmp/model-8b
{ nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader; python3 --version;
  lscpu | grep -E "^(Model name|CPU\(s\)):"; free -g | head -2; df -h /tmp /dev/shm | tail -2;
  python3 -c 'import importlib.metadata as m; print("torch", m.version("torch"), "sglang", m.version("sglang"))'
  echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-}"; } > "$OUT/machine.txt" 2>&1
say "machine noted"
python3 .sglkit/kit/make_model.py skeleton --out $M --size 8b >> "$LOG" 2>&1 || { say "no skeleton"; exit 3; }
python3 .sglkit/kit/make_model.py weights --model $M >> "$LOG" 2>&1 || { say "no weights"; exit 3; }
sync; say "model written: $(du -sh $M | cut -f1)"
# python gets the budget less 10 s for this trap; its own plan ends 15 s before that
timeout $(( BUDGET_S - 10 - ($(date +%s) - T0) )) python3 benchmarks/sglang-h200/weight_cache.py --model $M \
  --out "$OUT" --scratch "$SCRATCH" --deadline-s $(( BUDGET_S - 25 - ($(date +%s) - T0) )) >> "$LOG" 2>&1
say "done rc=$?"
