"""The NCCL stage as a study runs it, before its search: reuse the finished stage a resumed study has, else
run the stage's study on the study's nodes (`run_stage`: the driver runs it as a run of its own), then
hold its best values in every server trial. What the stage is (its study, knobs, sampler, messages) is
autotune.study.stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from autotune.config import Study
from autotune.node.pool import NodePool
from autotune.study import stages
from autotune.study.callbacks import KnobHeld
from autotune.study.records import record_nccl_stage
from autotune.study.run_state import RunState

RunStage = Callable[[Study, optuna.samplers.BaseSampler], optuna.Study]  # the stage's study, run to its end


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
    if result is None:
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
    record_nccl_stage(run.optuna_study, result.record())  # the answer names the values it held
    return result.held
