"""Where a study's start-ups went: each launch's phases (weight load, KV pool, CUDA graphs, ready) as its
trial recorded them, summed up for status and the report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.node.startup_phases import DUMP_PHASE, STARTUP_PHASES, startup_phases_text
from autotune.study.records import TrialRecord


def trial_startup_phases(trial: FrozenTrial) -> dict[str, float]:
    """The seconds per start-up phase `trial` recorded (empty when it never started a server)."""
    phases = TrialRecord.of(trial).startup_phases
    return {k: float(v) for k, v in phases.items() if k in STARTUP_PHASES and isinstance(v, int | float)}


def startup_summary(trials: Sequence[FrozenTrial]) -> str | None:
    """`start-up (median of 12 launches): weights 601 s, KV pool 1 s, CUDA graphs 44 s, ready 660 s`, from
    the launches that reached ready, each without a presharded dump it wrote (a one-time cost, said apart:
    `; 2 of them also wrote a presharded dump (306 s, once per layout)`); None when none did."""
    launched = [t for t in trials if "ready_s" in trial_startup_phases(t)]
    if not launched:
        return None
    ready = [_again(t) for t in launched]
    medians = {
        phase: statistics.median(values)
        for phase in STARTUP_PHASES
        if (values := [p[phase] for p in ready if phase in p])
    }
    launches = "launch" if len(ready) == 1 else f"median of {len(ready)} launches"
    summary = f"start-up ({launches}): {startup_phases_text(medians)}"
    dumps = [d for t in launched if (d := _dump_s(t))]
    if dumps:
        median = statistics.median(dumps)
        summary += f"; {len(dumps)} of them also wrote a presharded dump ({median:.0f} s, once per layout)"
    hint = _weight_cache_hint(trials, medians)
    return f"{summary}; {hint}" if hint is not None else summary


def _dump_s(trial: FrozenTrial) -> float:
    """The seconds `trial`'s launch spent writing a presharded dump (0: none)."""
    dump = TrialRecord.of(trial).startup_phases.get(DUMP_PHASE)
    return float(dump) if isinstance(dump, int | float) else 0.0


def _again(trial: FrozenTrial) -> dict[str, float]:
    """`trial`'s start-up phases as its launch would take them again: without the dump it wrote."""
    phases, dump = trial_startup_phases(trial), _dump_s(trial)
    return {k: v - dump if k in ("weight_load_s", "ready_s") else v for k, v in phases.items()}


# The phases inside a start-up that SGLang's log times (the page-cache read comes before the launch).
LOGGED_PHASES = ("init_s", "weight_load_s", "kv_pool_s", "cuda_graph_s")
# Weights worth mapping instead of loading: a share of start-up, and seconds a launch, both this large.
HINT_SHARE, HINT_S = 0.4, 60.0


def _weight_cache_hint(trials: Sequence[FrozenTrial], medians: dict[str, float]) -> str | None:
    """Where loading the weights is most of a start-up and the study never used (or was refused) SGLang's
    weight cache: the setting that would skip it, and the models it serves."""
    weights, ready = medians.get("weight_load_s"), medians.get("ready_s")
    if weights is None or not ready:
        return None
    # The phases SGLang logged run on the node's clock, `ready_s` on the driver's stopwatch: on a simulated
    # node with its start-up sped up, the phases sum to more than the time to ready.
    ready = max(ready, math.fsum(v for p, v in medians.items() if p in LOGGED_PHASES))
    if weights < HINT_S or weights < HINT_SHARE * ready:
        return None
    if any("weight cache" in note for t in trials for note in TrialRecord.of(t).startup_notes):
        return None
    return (
        f"loading the weights is {weights / ready:.0%} of it: where SGLang's weight cache serves the model "
        "(unquantized or block-wise FP8 weights, no speculative decoding), `startup: {weight_cache: true}` "
        'maps them from GPU memory after the first launch (docs/real-gpus.md, "The weight cache")'
    )
