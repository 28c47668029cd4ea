#!/usr/bin/env bash
# autotune's page cache step in front of real SGLang 0.5.17 loads, on a host with less free memory than the
# weights (page_cache_h200.py says what each start is). Two device calls, back to back:
#   call 1, carrying .sglkit/kit .sglkit/p1, timeout_s 120:  bash .sglkit/kit/install.sh
#   call 2, carrying .sglkit/kit .sglkit/p2, timeout_s 580:  BUDGET_S=565 bash benchmarks/sglang-h200/page_cache_h200.sh
# The 8B model and the dump (/tmp/presharded-pc) stay while the machine is warm: a third call reuses them.
# What comes back under $OUT: page_cache_h200.txt (the table), page_cache_h200.jsonl, machine.txt, run.log,
# server-logs.tar.gz (every start's server log).
NAME=page_cache_h200; . "$(dirname "$0")/device_prelude.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version; uname -r;
  lscpu | grep -E "^(Model name|CPU\(s\)):"; free -g; swapon --show; df -h /tmp | tail -1;
  python3 -c 'import importlib.metadata as m; print("torch", m.version("torch"), "sglang", m.version("sglang"))'
  } > "$OUT/machine.txt" 2>&1
say "machine noted"
model_8b
# python gets the budget less 15 s for the tar below; no start runs past its own deadline (30 s before that)
timeout $(( BUDGET_S - 15 - ($(date +%s) - T0) )) python3 "$(dirname "$0")/page_cache_h200.py" --model $M \
  --out "$OUT" ${PASSES:+--passes "$PASSES"} ${EXTRA:-} --deadline-s $(( BUDGET_S - 30 - ($(date +%s) - T0) )) >> "$LOG" 2>&1
say "python rc=$?"
ls -la /tmp/presharded-pc/*/* >> "$LOG" 2>&1; free -g >> "$LOG"; df -h /tmp | tail -1 >> "$LOG"
(cd "$OUT" && tar czf server-logs.tar.gz server-*.log && rm -f server-*.log)
say "done"
