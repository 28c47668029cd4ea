"""The study file's `startup:` section: what autotune does to make each server start faster."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt


class Startup(BaseModel):
    """Cheaper start-ups, each on by default and each switchable (docs/real-gpus.md, "Start-up").

    `multithread_weight_loading`: pass `--model-loader-extra-config '{"enable_multithread_load": true,
    "num_threads": N}'` where the node's SGLang version takes it (its dialect table says so), and the
    exported launch script keeps it; where `--weight-loader-disable-mmap` makes SGLang read the shards
    into memory (by default it maps them), the node turns it down (fewer threads, or off) when the largest
    shard times its ranks and threads would not fit the host's free memory. False: autotune passes
    nothing and SGLang's own default applies.
    `weight_loading_threads`: N; unset: SGLang's own default for the version (8 in 0.5.17 to 0.5.23).
    `compile_cache`: one JIT and compile cache folder per node (Triton, torch inductor, DeepGEMM,
    FlashInfer, TVM FFI, CUDA), kept across trials in the node's work folder, so only the first launch
    compiles.
    `weight_cache`: SGLang's weight cache daemon (`python -m sglang.srt.weight_cache.daemon`) holds the
    weights in GPU memory between trials and each launch it can serve maps them (`--weight-cache-mode
    client`) instead of loading them, at the --mem-fraction-static that gives the KV pool the flags give
    without it (autotune.node.weight_cache); the exported launch script stays the plain launch.
    `presharded_weights`: SGLang's `--load-format presharded` where the checkpoint is larger than the page
    cache keeps and the launch is tensor-parallel (autotune.node.presharded).
    `weights_in_page_cache`: where the weights a launch reads are larger than the host's page cache keeps,
    the part it can keep is read into it before each launch and the rest dropped from it, so every launch
    after the first reads that part from memory (autotune.node.page_cache); the node's step, not a flag.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    multithread_weight_loading: StrictBool = True
    weight_loading_threads: Annotated[StrictInt, Field(gt=0, le=256)] | None = None
    compile_cache: StrictBool = True
    # Off unless asked: it holds the weights' GPU memory between trials and changes how the KV pool is sized.
    weight_cache: StrictBool = False
    presharded_weights: StrictBool = True
    weights_in_page_cache: StrictBool = True
