#!/usr/bin/env bash
# Written by autotune: starts the server exactly as the trial did.

set -euo pipefail

export SGLANG_SIM_HARDWARE=rtx-pro-6000-pcie-x8
export SGLANG_SIM_MODEL=kimi-k2.5-int4
export SGLANG_SIM_TIME_SCALE=0.005
export NCCL_ALGO=Ring
export NCCL_MIN_NCHANNELS=32
export NCCL_MAX_NCHANNELS=32
export NCCL_P2P_LEVEL=PHB

exec python -m autotune.sim.sglang_server --model-path /models/Kimi-K2.5 --tp-size 8 --trust-remote-code --stream-interval 8 --mem-fraction-static 0.8 --chunked-prefill-size 4096 --max-running-requests 32 --attention-backend triton --enable-flashinfer-allreduce-fusion --enable-torch-symm-mem --ep-size 8 --host 127.0.0.1 --port 30000
