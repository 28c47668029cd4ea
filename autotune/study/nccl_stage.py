"""The NCCL stage as a study runs it, after its baseline and before its search: reuse the finished stage a
resumed study has, else run the stage's study on the study's nodes (`run_stage`: the driver runs it as a
run of its own), then hold its best values in every server trial. The baseline (SGLang's and NCCL's
defaults, held by no stage value) launches first, so that a user has a measured server after the first
launch, not after the stage's all-reduces (`pending`, `baseline_next`). What the stage is (its study,
knobs, sampler, messages) is autotune.study.stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import Study
from autotune.node.pool import NodePool
from autotune.study import stages
from autotune.study.callbacks import KnobHeld
from autotune.study.records import STAGE_AFTER_KEY, StudyRecord, TrialRecord, record_nccl_stage
from autotune.study.run_state import RunState

RunStage = Callable[[Study, optuna.samplers.BaseSampler], optuna.Study]  # the stage's study, run to its end


def pending(run: RunState) -> bool:
    """Whether `run`'s study has a stage still to run (none, or a finished one, on a resume)."""
    return stages.why_not(run.study) is None and stages.finished_stage(run.study, run.storage) is None


def baseline_next(optuna_study: optuna.Study) -> bool:
    """Whether the next trial Optuna hands out (its first waiting one) is the baseline: queued by a new
    study, queued again after an interrupted or failed launch, or by a resume whose baseline failed."""
    waiting = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    return bool(waiting) and TrialRecord.of(min(waiting, key=lambda t: t.number)).baseline


def held_values(run: RunState, pool: NodePool, run_stage: RunStage) -> dict[str, Any]:
    """The NCCL values every server trial of `run` holds ({} without a stage), told to the observers and
    recorded in the study (its answer names them)."""
    study = run.study
    reason = stages.why_not(study)
    if reason is not None:
        if reason.startswith("skipped"):
            run.observers.knob_held(KnobHeld(f"NCCL stage {reason}"))
        return {}
    result = stages.finished_stage(study, run.storage)
    name = study.name + stages.STAGE_SUFFIX
    # The server trials that ran before the stage (the baseline): a launch on each side of it is not paired
    # in time (trust.confirm.search_rounds). A resume keeps the first run's.
    earlier = StudyRecord.of(run.optuna_study).nccl_stage
    before = list(earlier.get(STAGE_AFTER_KEY) or []) if earlier is not None else []
    if result is None:
        before = [t.number for t in run.optuna_study.get_trials(deepcopy=False) if t.state.is_finished()]
        # Its time counts against the study's: the stage gets what is left of it.
        left = None if run.deadline is None else max(run.deadline - time.monotonic(), 1e-3)
        stage = stages.stage_study(study, stages.smallest_gpu_gb(pool), left)
        knobs = stages.stage_knobs(study)
        ran = run_stage(stage, stages.CoordinateAscent(knobs))
        result = stages.stage_result(knobs, ran.get_trials(deepcopy=False))
        if result is None:
            run.observers.knob_held(
                KnobHeld(f"NCCL stage {name}: not finished in the study's time; no NCCL value is held")
            )
            return {}
    for line in result.lines(name):
        run.observers.knob_held(KnobHeld(line))
    record = {**result.record(), STAGE_AFTER_KEY: before}
    record_nccl_stage(run.optuna_study, record)  # the answer names the values it held
    return result.held
