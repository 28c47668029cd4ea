#!/usr/bin/env bash
# Written by autotune: starts the server exactly as the trial did.

set -euo pipefail

export SGLANG_SIM_HARDWARE=rtx-pro-6000-pcie-x8
export SGLANG_SIM_MODEL=kimi-k2.5-int4
export SGLANG_SIM_TIME_SCALE=0.005

exec python -m autotune.sim.sglang_server --model-path /models/Kimi-K2.5 --tp-size 8 --trust-remote-code --stream-interval 8 --host 127.0.0.1 --port 30000
