"""The pre-flight memory check: configs certain to run out of memory are recorded, never launched.

Conservative by construction, it predicts two things only: SGLang's own KV cache check in its weakest form
(the weights alone over the static pool), and the memory edge a study met (a config that ran out of memory
fails again at a fraction no lower, all else the same). Why each is certain: docs/design.md, "The
pre-flight memory check".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from optuna.trial import FrozenTrial, TrialState

from autotune.study.records import TrialRecord
from autotune.trial.failures import STARTUP_OOMS, FailureKind
from autotune.trial.launch import TP_FLAGS, flag_value
from autotune.trial.memory_fraction import MEM_FRACTION, config_fraction, launch_fraction

# The out-of-memory kinds a launch meets (KV_POOL_TOO_SMALL is the opposite edge: too low a fraction).
STARTUP_OOM_KINDS = frozenset(kind.value for kind in STARTUP_OOMS)
LAUNCH_OOM_KINDS = STARTUP_OOM_KINDS | {FailureKind.OOM_UNDER_LOAD.value}
# Flags SGLang reads only once it serves (the scheduler's order and admission, how often it streams): it
# allocates nothing for them at start-up, so they cannot move a start-up out-of-memory.
SERVING_ONLY_FLAGS = frozenset({"--schedule-policy", "--schedule-conservativeness", "--stream-interval"})


def predicted_oom(
    flags: Iterable[tuple[str, str | None]], gpu_memory_gb: float | None, weight_gb: float | None
) -> str | None:
    """Why a launch with SGLang flags `flags` (ServerLaunch.flags) certainly fails SGLang's memory check, or
    None.

    `gpu_memory_gb` is one GPU's memory and `weight_gb` the model's weights in all, both in GB; without
    either, or without an explicit --mem-fraction-static, nothing is predicted.
    """
    flags = tuple(flags)
    fraction = launch_fraction(flags)
    if gpu_memory_gb is None or weight_gb is None or fraction is None:
        return None
    try:
        mfs = float(fraction)
        tp = int(flag_value(flags, *TP_FLAGS) or 1)
    except ValueError:
        return None  # SGLang's own argument parsing will say what is wrong
    per_gpu = weight_gb / max(tp, 1)
    pool = mfs * gpu_memory_gb
    if per_gpu <= pool:
        return None
    return (
        f"predicted OOM: the weights take {per_gpu:.1f} GB per GPU ({weight_gb:.0f} GB over TP {tp}), more "
        f"than the static pool of --mem-fraction-static {mfs:g} x {gpu_memory_gb:.1f} GB = {pool:.1f} GB; "
        "SGLang would load them and find no memory left for the KV cache (kv_pool_too_small)"
    )


def beyond_memory_edge(
    params: Mapping[str, object], hardware: str | None, trials: Iterable[FrozenTrial]
) -> str | None:
    """Why a config with search-space values `params` on `hardware` certainly runs out of memory, as
    `trials` show (one of them ran out with the same other values at a fraction no higher; at start-up,
    whatever the serving-only flags), or None."""
    fraction = config_fraction(params)
    if fraction is None:
        return None  # SGLang's own choice: not comparable

    def others(values: Mapping[str, object], ignored: frozenset[str]) -> dict[str, object]:
        return {name: value for name, value in values.items() if name != MEM_FRACTION and name not in ignored}

    for trial in trials:
        record = TrialRecord.of(trial)
        kind = record.failure_kind_text
        met = config_fraction(trial.params)
        at_startup = kind in STARTUP_OOM_KINDS
        ignored = SERVING_ONLY_FLAGS if at_startup else frozenset()
        if (
            trial.state != TrialState.PRUNED
            or record.skipped  # a prediction, not a launch that met the edge
            or kind not in LAUNCH_OOM_KINDS
            or record.hardware != hardware
            or met is None
            or met > fraction
            or others(trial.params, ignored) != others(params, ignored)
        ):
            continue
        same = "the same start-up settings" if at_startup else "the same settings"
        return (
            f"predicted OOM: trial {trial.number} ran out of memory ({kind}) with {same} at "
            f"--mem-fraction-static {met:g}; {fraction:g} leaves no more memory outside the KV pool"
        )
    return None
