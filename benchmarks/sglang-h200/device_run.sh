#!/usr/bin/env bash
# The real SGLang study (examples/sglang-h200.yaml) on the lent H200 machine, one device call at a time.
# Run from the checkout root on the GPU machine, after the device kit's first call stored its first part:
#   call 1, carrying .sglkit/kit .sglkit/p1:                 bash .sglkit/kit/install.sh
#   call 2.., carrying .sglkit/kit .sglkit/p2 .sglkit/at [.h200-carry]:  bash benchmarks/sglang-h200/device_run.sh
# Each call starts the study in the background in its own session (setsid) if it is not running yet, follows
# it until BUDGET_S, and brings back the study's stores under $OUT. A command on the machine ends within
# 10 minutes, so the next call (made within 30 s, while the machine is warm) finds the study still running.
# If the machine went back in between, the carried stores (.h200-carry/study.tar.gz, from an earlier $OUT)
# are unpacked and the study resumes: interrupted trials run again.
#   MODE=study (default) | compare (autotune compare, ROUNDS rounds) | status; ENQUEUE: configs to try next;
#   N_TRIALS: the study's budget for this run (all its trials count) instead of the study file's;
#   ACCEPT_CHANGES=1: the search space changed since the study began (enqueue and resume accept it)
#   RAY=1: trials run through the Ray node actor (a local Ray), not --no-ray; carry .raykit (built by
#   benchmarks/sglang-h200/build_raykit.sh) in the call that starts the study
# Send its output to a file or /dev/null, not a pipe: piped to `tail`, a call ran on to the 600 s limit 63 s
# after this script's last line (fourth session, call 2; not explained); the calls that did not pipe it ended
# with it. What it says is in $OUT/device_run.log anyway.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache TRITON_CACHE_DIR=/tmp/triton-cache
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true  # the machine reaches no network
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-560}))
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
KIT=${KIT:-.sglkit/kit}; AT=.sglkit/at; W=${W:-/tmp/h200}; STUDY=$W/${STUDY_FILE:-examples/sglang-h200.yaml}
STORES=$W/examples/.autotune/$(basename "$STUDY" .yaml)
LOG=$OUT/device_run.log
say() { echo "[device_run +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

bash "$KIT/install.sh" --require >> "$LOG" 2>&1 || { say "install.sh --require failed (parts missing?)"; tail -5 "$LOG"; exit 4; }
if [ -d "$AT/whl" ] && ! ls "$AT/whl" | cmp -s - /tmp/at/.at-installed 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/at \
    "$AT"/whl/*.whl >> "$LOG" 2>&1 && ls "$AT/whl" > /tmp/at/.at-installed
  say "autotune's wheels installed into /tmp/at"
fi

# The study runs from a copy: later calls replace the checkout, not the running study's code and files.
if [ ! -d $W ]; then
  mkdir -p $W && cp -r autotune examples search_spaces objectives $W/ && rm -rf $W/examples/.autotune
  if [ -f .h200-carry/study.tar.gz ]; then tar -xzf .h200-carry/study.tar.gz -C $W/examples && say "stores carried back unpacked"; fi
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version;
    lscpu | grep -E "^(Model name|CPU\(s\)):";  # an eager decode step waits on the host: which host matters
    PYTHONPATH=/tmp/site python3 -c 'import torch, sglang; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "sglang", sglang.__version__)'; } > "$OUT/machine.txt" 2>&1
fi
export PYTHONPATH=$W:/tmp/at:/tmp/site
if [ "${RAY:-0}" = 1 ]; then
  if [ ! -f /tmp/ray/.ray-installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ray .raykit/whl/*.whl \
      >> "$LOG" 2>&1 && touch /tmp/ray/.ray-installed || { say "no Ray: carry .raykit"; exit 5; }
    say "Ray installed into /tmp/ray"
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/ray RAY_DISABLE_USAGE_STATS=1  # Ray's workers inherit the path
fi
POOL=(--no-ray); [ "${RAY:-0}" = 1 ] && POOL=()
if [ -z "${NO_MODEL:-}" ] && [ ! -f /tmp/model-8b/config.json ]; then
  python3 "$KIT/make_model.py" skeleton --out /tmp/model-8b --size 8b >> "$LOG" 2>&1 || { say "no model"; exit 3; }
  say "model folder /tmp/model-8b (config + tokenizer; weights are --load-format dummy)"
fi

# The pid is the driver's own (bash execs it): a zombie or a reused pid has no autotune command line.
alive() { [ -f $W/pid ] && grep -qa autotune "/proc/$(cat $W/pid)/cmdline" 2>/dev/null; }
MODE=${MODE:-study}
if [ "$MODE" = study ] || [ "$MODE" = compare ]; then
  if alive; then say "the $(cat $W/mode) is running (pid $(cat $W/pid)): following it"
  else
    if [ "$MODE" = study ]; then
      verb=run; [ -f "$STORES/optuna.db" ] && verb=resume
      # ENQUEUE='--file F' or '--set=--flag=V ...': configs to run next (autotune enqueue's arguments), in
      # the call that starts the study only (each call that starts it queues them again)
      if [ -n "${ENQUEUE:-}" ]; then
        python3 -m autotune enqueue "$STUDY" $ENQUEUE ${ACCEPT_CHANGES:+--accept-changes} >> "$LOG" 2>&1 && say "queued: $ENQUEUE"  # paths: the checkout's
      fi
      args=("$verb" "$STUDY" "${POOL[@]}" ${N_TRIALS:+--n-trials "$N_TRIALS"} ${ACCEPT_CHANGES:+--accept-changes})
    else
      args=(compare "$STUDY" --rounds "${ROUNDS:-6}" "${POOL[@]}" --out $W/compare.json)
    fi
    rm -f $W/pid
    (cd $W && setsid nohup bash -c 'echo $$ > pid; exec python3 -m autotune "$@"' _ "${args[@]}" >> $W/$MODE.log 2>&1 < /dev/null &)
    for _ in $(seq 50); do [ -s $W/pid ] && break; sleep 0.1; done
    echo "$MODE" > $W/mode
    say "started: python3 -m autotune ${args[*]} (pid $(cat $W/pid))"
  fi
  while alive && [ $(( DEADLINE - $(date +%s) )) -gt 45 ]; do sleep 10; done
  alive && say "still running at the deadline: the next call follows it" || say "the $(cat $W/mode) ended"
fi
cp $W/*.log $W/compare.json "$OUT/" 2>/dev/null
python3 -m autotune status "$STUDY" > "$OUT/status.txt" 2>&1
python3 -m autotune status "$STUDY" --json > "$OUT/status.json" 2>&1
tar -czf "$OUT/study.tar.gz" -C $W/examples .autotune
say "done: $(du -h "$OUT/study.tar.gz" | cut -f1) of stores; $(grep -c '' "$OUT/status.txt") status lines"
tail -40 "$OUT/status.txt"
