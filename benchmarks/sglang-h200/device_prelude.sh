# Sourced by the device scripts beside it (NAME set first: the script's name in run.log): the environment
# every start there gets (NVLS off, no hub), $OUT and its run.log, `say`, the kit's parts checked, and
# `model_8b`: the kit's real-weights 8B in $M, made once and kept while the machine stays warm.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/run.log; BUDGET_S=${BUDGET_S:-565}
say() { echo "[$NAME +$(( $(date +%s) - T0 ))s] $*" >> "$LOG"; }
bash .sglkit/kit/install.sh --require >> "$LOG" 2>&1 || { say "install.sh --require failed"; exit 4; }
export PYTHONPATH=$PWD:/tmp/site
M=/tmp/model-8b
model_8b() {
  if [ "$(ls $M/*.safetensors 2>/dev/null | wc -l)" -ge 1 ] && [ -f $M/config.json ]; then
    say "model kept from an earlier call: $(du -sh $M | cut -f1)"
    return 0
  fi
  python3 .sglkit/kit/make_model.py skeleton --out $M --size 8b >> "$LOG" 2>&1 || { say "no skeleton"; exit 3; }
  python3 .sglkit/kit/make_model.py weights --model $M >> "$LOG" 2>&1 || { say "no weights"; exit 3; }
  sync; say "model written: $(du -sh $M | cut -f1)"
}
