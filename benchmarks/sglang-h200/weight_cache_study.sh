#!/usr/bin/env bash
# A 4-trial autotune study with `startup.weight_cache: true` against real SGLang 0.5.17 on the lent H200
# (benchmarks/sglang-h200/weight-cache-study/: the device kit's random 1.1B; its study file says what each
# trial is). Two device calls, back to back, from the checkout root, after the kit's build.sh and
# build_autotune.sh (.sglkit/kit, p1, p2, at):
#   call 1, carrying .sglkit/kit .sglkit/p1, timeout_s 120:            bash .sglkit/kit/install.sh
#   call 2, carrying .sglkit/kit .sglkit/p2 .sglkit/at, timeout_s 600: bash benchmarks/sglang-h200/weight_cache_study.sh > /dev/null 2>&1
# Call 2 ends within BUDGET_S (560 s): install and imports ~40 s, the 1.1B model ~12 s, then the kit's
# autotune_trials.sh runs the study (the first start on a fresh machine ~136 s with its cold JIT caches, the
# daemon ~25 s, three clients ~60-80 s each), then weight_cache_study.py reads what each trial did.
# What comes back under $OUT (7 files): autotune_run.log, autotune_status.txt, autotune_status.json,
# mlflow_runs.txt, autotune_study.tar.gz (the kit's; every trial's server.log and the daemon's
# weight-cache-daemon.log inside), weight_cache_study.txt (the table: launched fraction, load, KV pool,
# node seconds, notes; the client's pool against the disk-loaded baseline's; daemons, ready files and GPU
# apps left after the study), machine.txt.
set -uo pipefail
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; BUDGET_S=${BUDGET_S:-560}
STUDY=${STUDY:-benchmarks/sglang-h200/weight-cache-study/study.yaml}
{ nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  python3 --version; free -g | head -2; } > "$OUT/machine.txt" 2>&1
rm -rf "$(dirname "$STUDY")/.autotune"  # a study of its own each call
# The study gets the budget less 40 s for the summary below (autotune_trials.sh keeps 45 s of it for status).
STUDY=$STUDY N_TRIALS=${N_TRIALS:-4} BUDGET_S=$(( BUDGET_S - 40 - ($(date +%s) - T0) )) \
  bash .sglkit/kit/autotune_trials.sh > /dev/null 2>&1
echo "[weight_cache_study +$(( $(date +%s) - T0 ))s] autotune_trials.sh exit $?" >> "$OUT/autotune_run.log"
PYTHONPATH=$PWD:/tmp/at:/tmp/site timeout 30 python3 benchmarks/sglang-h200/weight_cache_study.py \
  --study "$STUDY" > "$OUT/weight_cache_study.txt" 2>&1
# The study stops its daemon; the summary above lists any daemon, ready file or GPU app it left.
echo "[weight_cache_study +$(( $(date +%s) - T0 ))s] done" >> "$OUT/weight_cache_study.txt"
