"""The memory fraction, `--mem-fraction-static`: the share of each GPU's memory that SGLang's static pool
(the weights, then the KV cache) takes. The one home of its flag's name, of reading it from a config or a
launch, of its default (autotune has none: SGLang chooses one when it is unset, and the baseline's log says
which), and of the smallest fraction SGLang's own message says would start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from autotune.trial.launch import flag_value

MEM_FRACTION = "--mem-fraction-static"
# SGLang 0.5.17 names the smallest fraction that starts when the weights leave no room for the KV cache
# (srt/mem_cache/kv_cache_configurator.py:1646-1655): "ValueError: Loaded weights leave no GPU memory for
# the KV cache under --mem-fraction-static=0.55. Raise --mem-fraction-static above 0.016 (minimum viable =
# 1 - available/pre = 0.0154). If using speculative decoding, draft weights are now counted."
_MINIMUM_VIABLE = re.compile(r"Raise --mem-fraction-static above ([0-9.]+)")


def config_fraction(params: Mapping[str, object]) -> float | None:
    """The fraction a config sets (its search-space value), None where it leaves SGLang to choose."""
    value = params.get(MEM_FRACTION)
    return value if isinstance(value, int | float) else None


def launch_fraction(flags: Iterable[tuple[str, str | None]]) -> str | None:
    """The fraction a launch's flags (ServerLaunch.flags) give SGLang, as written; None when unset."""
    return flag_value(flags, MEM_FRACTION)


def running_fraction(params: Mapping[str, object], server_choices: Mapping[str, float]) -> float | None:
    """The fraction a config runs at: its own, else the one SGLang chose for itself in the baseline
    (`server_choices`, from its log); None before the baseline said."""
    own = config_fraction(params)
    return own if own is not None else server_choices.get(MEM_FRACTION)


def fraction_to_hold(tokens: int, fraction: float, memory: Mapping[str, float]) -> float | None:
    """The fraction whose KV pool would hold `tokens`, from a launch's memory report (`memory`: its
    weights_gb, kv_cache_gb and kv_cache_tokens) at `fraction`; None where its pool held them already or
    the report lacks a figure. The static pool is `fraction` of the GPU (weights, then KV cache), so the
    pool grows by that GPU memory per unit of fraction; weights + KV over the fraction is at most the GPU's
    memory (a draft model's share makes it less), so the step this gives errs on the large side."""
    weights, kv_gb, kv_tokens = (memory.get(k) for k in ("weights_gb", "kv_cache_gb", "kv_cache_tokens"))
    if not weights or not kv_gb or not kv_tokens or fraction <= 0 or kv_tokens >= tokens:
        return None
    gpu_gb = (weights + kv_gb) / fraction
    return fraction + (tokens - kv_tokens) * (kv_gb / kv_tokens) / gpu_gb


def minimum_viable(message: str) -> float | None:
    """The smallest fraction SGLang's out-of-memory message says would start, or None where it names none."""
    named = _MINIMUM_VIABLE.search(message)
    return float(named.group(1)) if named is not None else None
