"""The names of the attributes autotune stores on Optuna trials and studies, in one place.

The stored strings never change (existing studies must still read); code uses these names instead of
the literals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A trial's user attributes.
FAILURE_KIND_ATTR = "failure_kind"  # a FailureKind value, or why a trial never launched
FAILURE_ATTR = "failure"  # the (redacted) line that says what went wrong
FAILURE_DESCRIPTION_ATTR = "failure_description"  # what that line means, in a sentence
ADVICE_ATTR = "advice"  # what to change, for the failure kind met
CULPRITS_ATTR = "culprits"  # the flags a failure names
MLFLOW_RUN_ATTR = "mlflow_run_id"
NODE_ATTR = "node"  # the node that ran the trial
NODE_S_ATTR = "node_s"  # the node's seconds on it: start-up and benchmark, or a job's run
HARDWARE_ATTR = "hardware"
DERIVED_ATTR = "derived"  # settings derived from the proposed ones
METRICS_ATTR = "metrics"  # the benchmark's measured metrics
LOAD_STOPPED_BY_ATTR = "load_stopped_by"
LOAD_WARNING_ATTR = "load_warning"  # a load search that ran out of steps before its tolerance
SERVER_PGID_ATTR = "server_pgid"
SERVER_MEMORY_ATTR = "server_memory"
STARTUP_NOTES_ATTR = "startup_notes"  # what the node changed in the launch to start it faster, and why
STARTUP_PHASES_ATTR = "startup_phases"  # seconds per start-up phase (node.startup_phases)
ACCEPT_LENGTH_ATTR = "accept_length"  # tokens per speculative verify pass (avg_spec_accept_length)
# A workload that shares prefixes: its cache hit rate, designed sharing, turns' TTFT (prefix_cache_text)
PREFIX_CACHE_ATTR = "prefix_cache"

# Defined beside the code that writes them until now; those modules import them from here.
OVER_LIMITS_ATTR = "over_limits"  # metric -> {limit, measured, excess, concurrency} of each broken limit
SHORT_CUTOFF_ATTR = "short_cutoff"  # the short value below which the node was told to stop
SHORT_VALUE_ATTR = "short_value"
PRUNED_BY_ATTR = "pruned_by"
REMEASURE_OF_ATTR = "remeasure_of"
REMEASURE_SETTINGS_ATTR = "remeasure"  # the study's user attr: the settings its re-measurement ran with
BASELINE_ATTR = "baseline"
RETRY_OF_ATTR = "retry_of"
SKIPPED_ATTR = "skipped"  # proposed but never launched (known incompatible): costs no node time or budget
DRIVER_ATTR = "driver"
CONFIG_ATTR = "config"
ABLATION_OF_ATTR = "ablation_of"
ABLATION_PARAM_ATTR = "ablation_param"
SERVER_CHOICES_ATTR = "server_choices"  # a study attribute: what the server chose in the baseline
QUEUED_ATTR = "queued"  # `autotune enqueue`: {set: the knobs a user set, from_trial: the rest from}
LAUNCH_ATTR = "launch"  # the launch's identity (study.rules.launch_identity): flags, and a digest of the rest
SAME_AS_ATTR = "same_as"  # proposed with the same launch as this earlier trial: recorded with its result
CONFIRM_ATTR = "confirm"  # a trial's: {round, position}; the study's: settings, configs
# A trial's: {id, round, position, config} of a `compare` round; the study's: every compare's {id, trial,
# rounds} (study.compare).
COMPARE_ATTR = "compare"
SCREEN_ATTR = "screen"  # a trial's: {knob: value}, a knob moved alone from the defaults (study.screening)
SCREENED_ATTR = "screened"  # a study attribute: knob -> {value, why}, held by screening (study.screening)
NCCL_STAGE_ATTR = "nccl_stage"  # a study attribute: the NCCL stage's held values (study.stages.StageResult)
STOPPED_ATTR = "stopped"  # a study attribute: why the search stopped early (study.stopping)
# A study attribute: the earlier study it started from (`run --from`: study.warm_start); a trial's: which
# of that study's configs it launches.
WARM_START_ATTR = "warm_start"
PROPOSED_ATTR = "autotune:proposed"  # a trial's system attribute: the move or repair that proposed it


def prefix_cache_text(record: Mapping[str, Any] | None) -> str | None:
    """One line for a trial's prefix cache (status, the report): what the server served from its cache
    beside what the workload shares, and sessions' TTFT of first and later turns. None: nothing to say."""
    if not record:
        return None
    hit, designed = record.get("hit_rate"), record.get("designed")
    parts = [
        "prefix cache: "
        + (
            f"{hit:.0%} of prompt tokens served from the server's cache"
            if hit is not None
            else "the server reported no cached tokens"
        )
        + (f" (the workload shares {designed:.0%})" if designed is not None else "")
    ]
    first, later = record.get("ttft_first_turn_ms"), record.get("ttft_later_turns_ms")
    if first is not None and later is not None:
        parts.append(f"TTFT first turns {first:.0f} ms, later turns {later:.0f} ms")
    return "; ".join(parts)
