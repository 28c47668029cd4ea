#!/usr/bin/env bash
# Written by autotune: starts the server exactly as the trial did.

set -euo pipefail

export SGLANG_SIM_HARDWARE=rtx-pro-6000-pcie-x8
export SGLANG_SIM_MODEL=kimi-k2.5-int4
export SGLANG_SIM_TIME_SCALE=0.005
export NCCL_ALGO=Ring
export NCCL_PROTO=LL128
export NCCL_MAX_NCHANNELS=1
export NCCL_BUFFSIZE=4194304

exec python -m autotune.sim.sglang_server --model-path /models/Kimi-K2.5 --tp-size 8 --trust-remote-code --stream-interval 8 --mem-fraction-static 0.81 --cuda-graph-max-bs 128 --chunked-prefill-size 8192 --max-running-requests 32 --attention-backend triton --enable-flashinfer-allreduce-fusion --enable-torch-symm-mem --speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-eagle-topk 2 --speculative-num-draft-tokens 14 --host 127.0.0.1 --port 30000 --speculative-draft-model-path /models/Kimi-K2.5-EAGLE3
