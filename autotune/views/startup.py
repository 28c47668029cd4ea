"""Where a study's start-ups went: each launch's phases (weight load, KV pool, CUDA graphs, ready) as its
trial recorded them, summed up for status and the report."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.node.startup_phases import STARTUP_PHASES, startup_phases_text
from autotune.study.records import TrialRecord


def trial_startup_phases(trial: FrozenTrial) -> dict[str, float]:
    """The seconds per start-up phase `trial` recorded (empty when it never started a server)."""
    phases = TrialRecord.of(trial).startup_phases
    return {k: float(v) for k, v in phases.items() if k in STARTUP_PHASES and isinstance(v, int | float)}


def startup_summary(trials: Sequence[FrozenTrial]) -> str | None:
    """`start-up (median of 12 launches): weights 601 s, KV pool 1 s, CUDA graphs 44 s, ready 660 s`, from
    the launches that reached ready; None when none did."""
    ready = [p for p in map(trial_startup_phases, trials) if "ready_s" in p]
    if not ready:
        return None
    medians = {
        phase: statistics.median(values)
        for phase in STARTUP_PHASES
        if (values := [p[phase] for p in ready if phase in p])
    }
    launches = "launch" if len(ready) == 1 else f"median of {len(ready)} launches"
    summary = f"start-up ({launches}): {startup_phases_text(medians)}"
    hint = _weight_cache_hint(trials, medians)
    return f"{summary}; {hint}" if hint is not None else summary


# Weights worth mapping instead of loading: a share of start-up, and seconds a launch, both this large.
HINT_SHARE, HINT_S = 0.4, 60.0


def _weight_cache_hint(trials: Sequence[FrozenTrial], medians: dict[str, float]) -> str | None:
    """Where loading the weights is most of a start-up and the study never used (or was refused) SGLang's
    weight cache: the setting that would skip it, and the models it serves."""
    weights, ready = medians.get("weight_load_s"), medians.get("ready_s")
    if weights is None or not ready or weights < HINT_S or weights < HINT_SHARE * ready:
        return None
    if any("weight cache" in note for t in trials for note in TrialRecord.of(t).startup_notes):
        return None
    return (
        f"loading the weights is {weights / ready:.0%} of it: where SGLang's weight cache serves the model "
        "(unquantized or block-wise FP8 weights, no speculative decoding), `startup: {weight_cache: true}` "
        'maps them from GPU memory after the first launch (docs/real-gpus.md, "The weight cache")'
    )
