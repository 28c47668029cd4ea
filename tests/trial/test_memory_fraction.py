"""The memory fraction's one home: its flag, read from a config, a launch and SGLang's message, and its
default (SGLang's own choice, from the baseline's log)."""

from __future__ import annotations

import pytest

from autotune.node.logwatch import server_memory
from autotune.trial.memory_fraction import (
    MEM_FRACTION,
    config_fraction,
    fraction_to_hold,
    launch_fraction,
    minimum_viable,
    running_fraction,
)

# SGLang 0.5.17's message when the weights leave no room for the KV cache (kv_cache_configurator.py).
KV_POOL_LINE = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.55. "
    "Raise --mem-fraction-static above 0.016 (minimum viable = 1 - available/pre = 0.0154)."
)


def test_a_config_sets_a_fraction_or_leaves_it_to_sglang() -> None:
    assert MEM_FRACTION == "--mem-fraction-static"
    assert config_fraction({MEM_FRACTION: 0.85}) == 0.85
    assert config_fraction({MEM_FRACTION: None}) is None and config_fraction({}) is None
    assert config_fraction({MEM_FRACTION: "0.85"}) is None  # not a sampled number: not comparable


def test_a_config_runs_at_its_own_fraction_else_at_the_one_sglang_chose() -> None:
    chosen = {MEM_FRACTION: 0.893}
    assert running_fraction({MEM_FRACTION: 0.8}, chosen) == 0.8
    assert running_fraction({}, chosen) == 0.893
    assert running_fraction({}, {}) is None  # before the baseline's log said


def test_a_launch_gives_the_last_fraction_and_sglang_names_the_smallest_that_starts() -> None:
    assert launch_fraction([(MEM_FRACTION, "0.7"), ("--tp-size", "8"), (MEM_FRACTION, "0.8")]) == "0.8"
    assert launch_fraction([("--tp-size", "8")]) is None
    assert minimum_viable(KV_POOL_LINE) == 0.016
    assert minimum_viable("Not enough memory. Please try to increase --mem-fraction-static.") is None


# The memory report of real SGLang 0.5.17 on the lent H200 (the kit's 8B at SGLang's own 0.909;
# benchmarks/sglang-h200/startup/server-warm-8.log), as the node reads it.
H200_REPORT = (
    "[2026-12-05 03:02:49] Load weight end. elapsed=1.94 s, type=LlamaForCausalLM, avail mem=125.62 GB, "
    "mem usage=13.51 GB.\n"
    "[2026-12-05 03:02:50] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 925293, K size: 56.48 GB, "
    "V size: 56.48 GB"
)


def test_the_fraction_that_holds_more_tokens_grows_by_the_gpus_memory_per_unit() -> None:
    memory: dict[str, float] = {}
    for line in H200_REPORT.splitlines():
        memory.update(server_memory(line))
    # Weights and KV over the fraction: 139.1 GB, the H200's 139.8 GiB less what the fraction leaves out.
    assert (memory["weights_gb"] + memory["kv_cache_gb"]) / 0.909 == pytest.approx(139.1, abs=0.1)
    # 100,000 tokens more at 112.96 GB / 925,293 tokens = 12.2 GB: +0.0878 of 139.1 GB.
    assert fraction_to_hold(1_025_293, 0.909, memory) == pytest.approx(0.909 + 12.208 / 139.07, abs=1e-4)
    assert fraction_to_hold(925_293, 0.909, memory) is None  # it holds them already
    assert fraction_to_hold(1_025_293, 0.909, {**memory, "kv_cache_gb": 0.0}) is None  # a report lacking
