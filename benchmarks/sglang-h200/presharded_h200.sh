#!/usr/bin/env bash
# SGLang 0.5.17's --load-format presharded on the lent GPU, against the default loader (presharded_h200.py
# says what each start is). Two device calls, back to back, a third on the still-warm machine if needed:
#   call 1, carrying .sglkit/kit .sglkit/p1, timeout_s 120:  bash .sglkit/kit/install.sh
#   call 2, carrying .sglkit/kit .sglkit/p2, timeout_s 580:  BUDGET_S=565 bash benchmarks/sglang-h200/presharded_h200.sh
#   call 3, carrying .sglkit/kit, same machine:  CONDITIONS=default-warm,presharded-cold,default-cold BUDGET_S=565 bash ...
# The 8B model (and the dump under /tmp/presharded) stay while the machine is warm: call 3 reuses them.
# (Session 8 ran these two files from a scratch folder: the device call sends the session's checkout, which
# did not have them; RESULTS-sglang-h200.md says how. The script finds presharded_h200.py beside itself.)
# What comes back under $OUT: presharded_h200.txt (the table), presharded_h200.jsonl, machine.txt, run.log,
# server-logs.tar.gz (every start's server log).
NAME=presharded_h200; . "$(dirname "$0")/device_prelude.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version;
  lscpu | grep -E "^(Model name|CPU\(s\)):"; free -g | head -2; df -h /tmp | tail -1;
  python3 -c 'import importlib.metadata as m; print("torch", m.version("torch"), "sglang", m.version("sglang"))'
  python3 -c 'import xxhash; print("xxhash", xxhash.VERSION, xxhash.xxh3_128(b"x").hexdigest())'; } > "$OUT/machine.txt" 2>&1
say "machine noted"
model_8b
ls -d /tmp/presharded/*/* >> "$LOG" 2>&1
# python gets the budget less 15 s for the tar below; no start runs past its own deadline (30 s before that)
timeout $(( BUDGET_S - 15 - ($(date +%s) - T0) )) python3 "$(dirname "$0")/presharded_h200.py" --model $M \
  --out "$OUT" ${CONDITIONS:+--conditions "$CONDITIONS"} \
  --deadline-s $(( BUDGET_S - 30 - ($(date +%s) - T0) )) >> "$LOG" 2>&1
say "python rc=$?"
du -sh /tmp/presharded/* >> "$LOG" 2>&1; ls -la /tmp/presharded/*/* >> "$LOG" 2>&1; df -h /tmp | tail -1 >> "$LOG"
(cd "$OUT" && tar czf server-logs.tar.gz server-*.log && rm -f server-*.log)
say "done"
