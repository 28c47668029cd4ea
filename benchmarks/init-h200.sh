#!/usr/bin/env bash
# `autotune init` on the lent H200 (real nvidia-smi, real SGLang 0.5.17 from the device kit), from the checkout
# root on the GPU machine; its output ($OUT/init-h200.txt) is what to commit as benchmarks/init-h200.txt. Two
# device calls, one right after the other:
#   1. carrying .sglkit/kit .sglkit/p1:            bash .sglkit/kit/install.sh
#   2. carrying .sglkit/kit .sglkit/p2 .sglkit/at: bash benchmarks/init-h200.sh
# It installs the bundle into /tmp/site and autotune's wheels into /tmp/at, makes the kit's random-weight 1.1B
# Llama in /tmp/model-1b (config, tokenizer, safetensors and their index), then runs init three ways: the
# node as it is (SGLang on PYTHONPATH=/tmp/site, passed with --env), a node whose Python has no SGLang with a
# folder without config.json, and an existing --out; then validate on the study it wrote.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash .sglkit/kit/install.sh --require > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 4; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/at \
  .sglkit/at/whl/*.whl > "$OUT/at.log" 2>&1
M=/tmp/model-1b
if [ ! -f $M/model.safetensors.index.json ]; then
  { python3 .sglkit/kit/make_model.py skeleton --out $M --size 1b && python3 .sglkit/kit/make_model.py weights --model $M; } \
    > "$OUT/model.log" 2>&1
fi
export PYTHONPATH=$PWD:/tmp/at:/tmp/site  # autotune and its dependencies; SGLang's path goes with --env
W=$(mktemp -d) && cd "$W" || exit 3
run() {
  echo "\$ $*"
  local t=$SECONDS
  python3 -m autotune "$@" 2>&1
  echo "(exit status $?, $((SECONDS - t)) s)"
  echo
}
{
  echo "# autotune init on the lent H200, $(date -u '+%Y-%m-%d %H:%M UTC'): benchmarks/init-h200.sh"
  echo "# PYTHONPATH=<repo>:/tmp/at:/tmp/site for autotune itself; the node's SGLang path is given with --env."
  echo
  echo "\$ nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv,noheader"
  nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv,noheader
  echo "\$ nvidia-smi topo -m"
  nvidia-smi topo -m
  echo
  echo "## 1. The node as it is"
  run init --model /tmp/model-1b --env PYTHONPATH=/tmp/site --out study.yaml
  echo "## The study it wrote (study.yaml)"
  cat study.yaml
  echo
  run validate study.yaml
  echo "## 2. A Python without SGLang, and a folder without config.json"
  run init --model /tmp --env PYTHONPATH=/nonexistent --out other.yaml
  echo "## 3. An existing study file is kept"
  run init --model /tmp/model-1b --env PYTHONPATH=/tmp/site --out study.yaml
} > "$OUT/init-h200.txt" 2>&1
cat "$OUT/init-h200.txt"
