"""The memory fraction's one home: its flag, read from a config, a launch and SGLang's message, and its
default (SGLang's own choice, from the baseline's log)."""

from __future__ import annotations

from autotune.trial.memory_fraction import (
    MEM_FRACTION,
    config_fraction,
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
