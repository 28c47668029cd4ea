#!/usr/bin/env bash
# Ray for the lent GPU machine, which has neither it nor a network: .raykit/whl/ (ignored), one slimmed
# wheel that travels in a call of its own (carry .raykit; about 31 MiB with nothing else but the checkout).
# Its needs that the machine's image lacks (jsonschema and its three) come with the SGLang bundle in
# /tmp/site. Slimmed with the device kit's repack.py: no Java workers (ray/jars, 31 MiB), no dashboard UI,
# none of the libraries autotune does not import (rllib, data, serve, llm, tune, train, air); the
# binaries stripped of debug info. 75.6 -> 31.4 MiB.
#   bash benchmarks/sglang-h200/build_raykit.sh; then on the machine, RAY=1 bash benchmarks/sglang-h200/device_run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT_SRC:-../shared/device-kit}
VERSION=$(python3 -c 'import ray; print(ray.__version__)' 2>/dev/null || .venv/bin/python -c 'import ray; print(ray.__version__)')
raw=$(mktemp -d); trap 'rm -rf "$raw"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --dest "$raw" "ray==$VERSION"
rm -rf .raykit/whl && mkdir -p .raykit/whl
drops=(ray/jars/* ray/dashboard/client/build/* ray/rllib/* ray/data/* ray/serve/* ray/llm/* ray/tune/* ray/train/* ray/air/*)
args=(); for d in "${drops[@]}"; do args+=(--drop "$d"); done
python3 "$KIT/repack.py" "$raw"/ray-*.whl .raykit/whl "${args[@]}" \
  --strip '*.so' --strip ray/core/src/ray/gcs/gcs_server --strip ray/core/src/ray/raylet/raylet
grep -qx '/.raykit/' .git/info/exclude 2>/dev/null || echo '/.raykit/' >> .git/info/exclude
du -sh .raykit/whl/*
