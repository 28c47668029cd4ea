"""What the driver hands a node for one trial (`TrialRequest`): the launch, the workload, the timeouts, and
what to measure, with the short run's cutoff as the pruner sets it now.
"""

from __future__ import annotations

import optuna

from autotune.config import Study
from autotune.dialect import Dialect
from autotune.measure.plan import MeasurementPlan, plan_for
from autotune.study.pruning import load_cutoff, short_cutoff, short_pruner
from autotune.study.records import TrialRecord, record_short_cutoff
from autotune.study.run_state import RunState
from autotune.study.trust import node_budget
from autotune.study.trust.confirm import DEFAULTS_CUTOFF_IS, defaults_cutoff
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import takes_presharded, takes_weight_cache
from autotune.trial.wire import TrialRequest


def trial_request(
    run: RunState, trial: optuna.Trial, launch: ServerLaunch, baseline: bool, dialect: Dialect | None = None
) -> TrialRequest:
    """The request that runs `trial` as `launch` (the seeded one) on a node whose SGLang is `dialect`."""
    study = run.study
    startup = study.file.startup
    return TrialRequest(
        number=trial.number,
        launch=launch,
        workload=study.objective.workload,
        startup_timeout_s=study.file.timeouts.startup_s,
        benchmark_timeout_s=study.file.timeouts.benchmark_s,
        seed=trial.number,
        plan=None if study.objective.is_job else measurement_plan(study, run.optuna_study, trial, baseline),
        job=study.objective.is_job,  # the launch measures itself (autotune.node.job)
        compile_cache=startup.compile_cache,
        weight_cache=startup.weight_cache and takes_weight_cache(dialect),
        # Not both: the daemon would load with the launch's --load-format, a path nothing here has tried.
        presharded_weights=(
            startup.presharded_weights and not startup.weight_cache and takes_presharded(dialect)
        ),
        weights_in_page_cache=startup.weights_in_page_cache and not startup.weight_cache,
    )


def measurement_plan(
    study: Study, optuna_study: optuna.Study, trial: optuna.Trial, baseline: bool
) -> MeasurementPlan:
    """What the node measures: the objective's ladder, its short run first with the pruner's cutoff now
    (never for the baseline, whose short value is a reference, nor for a re-measurement); a load search's
    cutoff: the study's best for a search launch, `defaults_cutoff` for the defaults in a round."""
    objective = study.objective
    again = TrialRecord.of(trial).remeasure_of is not None
    cutoff = None
    if objective.short_first is not None and not (baseline or again):
        cutoff = short_cutoff(optuna_study, short_pruner(objective.short_first))
        if cutoff is not None:
            record_short_cutoff(trial, cutoff)
    search = objective.load_search
    below, below_is = None, None  # a search launch's load search stops below the study's best
    if search is not None and search.stop_below_best and not (baseline or again):
        below = load_cutoff(optuna_study)
    elif search is not None and baseline and again and TrialRecord.of(trial).confirm is not None:
        below = defaults_cutoff(study, optuna_study)  # a round's defaults, below their configs'
        below_is = DEFAULTS_CUTOFF_IS
    floor = node_budget.step_floor(study, optuna_study) if search is not None else None
    return plan_for(
        objective,
        short=not again,
        cutoff=cutoff,
        load_cutoff=below,
        load_cutoff_is=below_is,
        load_floor=floor,
    )
