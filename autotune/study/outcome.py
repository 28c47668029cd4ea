"""Judging a trial: what a node's result, a refusal to launch or a Ctrl-C is told to Optuna as.

Each function records on the live trial what is read back later (user attributes, constraints, the short
measurement as an intermediate value) and returns an `Outcome`: the state and values to tell Optuna, and
what the loop's observers show of it. Telling Optuna is the loop's: it also retries and learns from failures.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.measure.client import BenchmarkResult
from autotune.measure.load_search import decided_steps
from autotune.measure.metrics import OBJECTIVE_METRICS
from autotune.study.pruning import SHORT_STEP
from autotune.study.records import (
    TrialRecord,
    record_failure,
    record_measurement,
    record_metrics,
    record_pruned_by,
    record_same_as,
    record_server,
    record_short,
    record_skipped,
)
from autotune.trial.failures import Failure, FailureKind
from autotune.trial.wire import TrialResult

MEMORY_CONSTRAINT = "memory"


@dataclass(frozen=True)
class Outcome:
    """A finished trial as Optuna is told it and as a person is shown it."""

    state: TrialState
    # What Optuna is told; None for PRUNED and FAIL (a pruned trial keeps its last reported value).
    values: tuple[float, ...] | None
    # The value shown: the first objective's, the short one when pruned after it, the penalty of an OOM.
    value: float | None
    failure_kind: FailureKind | None = None
    failure: Failure | None = None  # the node's account of what went wrong
    refusal: str | None = None  # why a proposal was never launched
    over_limits: tuple[str, ...] = ()  # each broken limit, described
    load_stopped_by: str | None = None
    load_warning: str | None = None  # a max_load whose search ran out of steps: say so
    pruned_by: str | None = None


def judge(study: Study, trial: optuna.Trial, result: TrialResult) -> Outcome:
    """A node's result: a job's metrics or a measurement (COMPLETE, or PRUNED after the short run), or a
    failure (FAIL, or PRUNED with the penalty for an out-of-memory, so samplers learn the region is bad)."""
    record_server(
        trial,
        pgid=result.server_pgid,
        memory=result.server_memory,
        startup_phases=result.startup_phases,
        startup_notes=result.startup_notes,
        server_choices=result.server_choices,
    )
    if result.ok and result.benchmark is None:  # a job trial: its metrics are its measurement
        return _job(study, trial, result.metrics)
    if result.ok:
        assert result.benchmark is not None  # TrialResult.ok says so
        return _measured(study, trial, result.benchmark)
    assert result.failure is not None  # a result that is not ok carries its failure
    return _failed(study, trial, result.failure)


def _measured(study: Study, trial: optuna.Trial, measured: BenchmarkResult) -> Outcome:
    """Its limits as constraints (and by how much each was broken), its short measurement as the intermediate
    value, then PRUNED (stopped after it) or COMPLETE."""
    objective = study.objective
    trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
    over = {}
    for check in objective.limit_checks(measured):
        trial.set_constraint(check.metric, check.excess)
        if check.violated:
            over[check.metric] = {
                "limit": check.limit,
                "measured": check.measured,
                "excess": check.excess,
                "concurrency": check.concurrency,
                "text": check.describe(),
            }
    caching = measured.cache_hit_rate is not None or measured.designed_hit_rate is not None
    record_measurement(
        trial,
        over_limits=over,
        accept_length=measured.accept_length,  # the default sampler steers the speculative tree by it
        load_stopped_by=measured.load_stopped_by,
        load_warning=measured.load_warning,
        load_decided=decided_steps(measured),
        load_below=measured.load_below,
        load_bracket=measured.load_bracket,
        load_missed=measured.load_missed,
        prefix_cache={
            "hit_rate": measured.cache_hit_rate,
            "designed": measured.designed_hit_rate,
            "ttft_first_turn_ms": measured.mean_ttft_first_turn_ms,
            "ttft_later_turns_ms": measured.mean_ttft_later_turns_ms,
        }
        if caching
        else None,
    )
    broken = tuple(str(v["text"]) for v in over.values())
    stopped_by = measured.load_stopped_by
    short = measured if measured.stopped_early else measured.short
    if short is not None and not objective.is_multi_objective:
        short_value = objective.value(short)
        record_short(trial, short_value)
        trial.report(short_value, SHORT_STEP)
        if measured.stopped_early:
            cutoff = TrialRecord.of(trial).short_cutoff
            why = (
                f"short measurement: {objective.metric} {short_value:.4g} worse than the pruner's "
                f"cutoff {cutoff:.4g}"
                if measured.max_load is None or stopped_by is None
                else f"load search: {stopped_by}"  # it stopped below its cutoff (measure.load_search)
            )
            record_pruned_by(trial, why)
            # Told PRUNED without values: the stored value is the short one, reported above.
            return Outcome(
                TrialState.PRUNED,
                None,
                short_value,
                over_limits=broken,
                load_stopped_by=stopped_by,
                load_warning=measured.load_warning,
                pruned_by=why,
            )
    if TrialRecord.of(trial).compare is not None:  # `compare` shows every figure of its rounds
        record_metrics(trial, benchmark_figures(measured))
    values = tuple(objective.values(measured))
    return Outcome(
        TrialState.COMPLETE,
        values,
        values[0],
        over_limits=broken,
        load_stopped_by=stopped_by,
        load_warning=measured.load_warning,
    )


def benchmark_figures(benchmark: BenchmarkResult) -> dict[str, float]:
    """The benchmark's figures a config changes, each with a better direction (throughputs, latencies)."""
    figures = {}
    for name in OBJECTIVE_METRICS:
        value = getattr(benchmark, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):  # None: a figure it lacks
            figures[name] = float(value)
    return figures


def _job(study: Study, trial: optuna.Trial, measured: dict[str, float]) -> Outcome:
    """A job's metrics (kept as the `metrics` attribute, intervals included), its limits as constraints."""
    objective = study.objective
    record_metrics(trial, measured)
    trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
    for key, amount in objective.constraints(measured).items():
        trial.set_constraint(key, amount)
    values = tuple(objective.values(measured))
    return Outcome(TrialState.COMPLETE, values, values[0])


def _failed(study: Study, trial: optuna.Trial, failure: Failure) -> Outcome:
    record_failure(
        trial,
        failure.kind,
        study.secrets.redact(failure.line)[:500],
        description=study.secrets.redact(failure.description),
        advice=failure.advice,
        culprits=failure.culprits,
    )
    if not failure.kind.is_oom:
        return Outcome(TrialState.FAIL, None, None, failure.kind, failure)
    # Penalized and pruned: TPE learns the region is bad, constraint-aware samplers learn why.
    penalty = study.file.failures.oom_penalty
    trial.set_constraint(MEMORY_CONSTRAINT, 1.0)
    for key in study.objective.limits:
        trial.set_constraint(key, 1.0)
    if study.objective.is_multi_objective:  # multi-objective trials cannot report(): pruned without a value
        return Outcome(TrialState.PRUNED, None, None, failure.kind, failure)
    trial.report(penalty, 0)
    return Outcome(TrialState.PRUNED, None, penalty, failure.kind, failure)


def refused(trial: optuna.Trial, kind: FailureKind, why: str) -> Outcome:
    """A launch the study's `never_launch` forbids: FAIL, never run."""
    record_failure(trial, kind, why)
    return Outcome(TrialState.FAIL, None, None, kind, refusal=why)


def skipped(study: Study, trial: optuna.Trial, why: str, *, oom: bool) -> Outcome:
    """A proposal never launched, costing no node time nor budget: a known incompatibility (FAIL), or a
    predicted OOM (PRUNED with the penalty, so samplers learn from it)."""
    kind = FailureKind.PREDICTED_OOM if oom else FailureKind.KNOWN_INCOMPATIBLE
    record_skipped(trial)
    record_failure(trial, kind, why)
    if not oom:
        return Outcome(TrialState.FAIL, None, None, kind, refusal=why)
    penalty = study.file.failures.oom_penalty
    trial.set_constraint(MEMORY_CONSTRAINT, 1.0)
    if study.objective.is_multi_objective:  # multi-objective trials cannot report(): pruned without a value
        return Outcome(TrialState.PRUNED, None, None, kind, refusal=why)
    trial.report(penalty, 0)
    return Outcome(TrialState.PRUNED, None, penalty, kind, refusal=why)


def same_as(trial: optuna.Trial, earlier: FrozenTrial) -> Outcome:
    """A proposal of a launch made before (`earlier`): never launched, costing no node time nor budget,
    told with the earlier launch's result (state, values, constraints, failure) so the sampler learns, and
    marked `same_as` (skipped: never a second measurement of the config)."""
    record_same_as(trial, earlier)
    for key, amount in earlier.constraints.items():
        trial.set_constraint(key, amount)
    why = f"the same launch as trial {earlier.number}: not launched again"
    if earlier.state == TrialState.COMPLETE and earlier.values is not None:
        return Outcome(TrialState.COMPLETE, tuple(earlier.values), earlier.values[0], refusal=why)
    if earlier.state == TrialState.PRUNED and earlier.value is not None:
        trial.report(earlier.value, max(earlier.intermediate_values, default=0))
        return Outcome(TrialState.PRUNED, None, earlier.value, refusal=why)
    return Outcome(earlier.state, None, None, refusal=why)


def interrupted(trial: optuna.Trial) -> Outcome:
    """A trial a Ctrl-C stopped: FAIL, saying nothing about its settings (it runs again)."""
    record_failure(trial, FailureKind.INTERRUPTED)
    return Outcome(TrialState.FAIL, None, None, FailureKind.INTERRUPTED)
