"""The NCCL stage as a study runs it, after its baseline and before its search: reuse the finished stage a
resumed study has, else run the stage's study on the study's nodes (`run_stage`: the driver runs it as a
run of its own), then hold its best values in every server trial. The baseline (SGLang's and NCCL's
defaults, held by no stage value) launches first, so that a user has a measured server after the first
launch, not after the stage's all-reduces (`pending`, `baseline_next`). What the stage is (its study,
knobs, sampler, messages) is autotune.study.stages.
"""

from __future__ import annotations

import math
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
from autotune.study.trust import node_budget
from autotune.study.trust.stopping import load_max_settled

RunStage = Callable[[Study, optuna.samplers.BaseSampler], optuna.Study]  # the stage's study, run to its end
# Under a node-hour budget the stage gets at most this share of the hours the search may spend (the
# budget less what the baseline spent and the confirmation's reserve): a tight budget still searches. With
# the transport's knobs swept first, a fifth keeps what the PCIe nodes gain and gives the NVLink nodes,
# whose NCCL values move the answer 2-4%, server launches instead (2x auto_benchmark's hours, 16 seeds:
# H200 0.608 -> 0.751 of the best known at 0.5 -> 0.2; benchmarks/RESULTS.md, first section).
STAGE_SHARE = 0.2


def settled(run: RunState) -> stages.StageResult | None:
    """The stage `run`'s study holds: its finished pass, or one the study recorded as cut short (its
    search then ran with those values, so a resume keeps them); None while it is still to run."""
    result = stages.finished_stage(run.study, run.storage, run.nvlink)
    record = StudyRecord.of(run.optuna_study).nccl_stage
    if result is None and record is not None and record.get("shortened"):
        return stages.StageResult.from_record(record)
    return result


def pending(run: RunState) -> bool:
    """Whether `run`'s study has a stage still to run (none, or a settled one, on a resume)."""
    return stages.why_not(run.study) is None and settled(run) is None


def stage_room_s(run: RunState) -> float | None:
    """The node seconds the stage may still spend: `STAGE_SHARE` of what the search may (None: no budget)."""
    hours = node_budget.node_hours(run.study, run.optuna_study)
    if hours.left_s is None:
        return None
    return max(hours.left_s - hours.reserve_s, 0.0) * STAGE_SHARE


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
    if reason is None and (settled_why := load_max_settled(study, run.optuna_study)) is not None:
        reason = "skipped: " + settled_why.removeprefix("stopped early: ")
    if reason is not None:
        if reason.startswith("skipped"):
            run.observers.knob_held(KnobHeld(f"NCCL stage {reason}"))
        return {}
    result = settled(run)
    name = study.name + stages.STAGE_SUFFIX
    # The server trials that ran before the stage (the baseline): a launch on each side of it is not paired
    # in time (trust.confirm.search_rounds). A resume keeps the first run's.
    earlier = StudyRecord.of(run.optuna_study).nccl_stage
    before = list(earlier.get(STAGE_AFTER_KEY) or []) if earlier is not None else []
    if result is None:
        before = [t.number for t in run.optuna_study.get_trials(deepcopy=False) if t.state.is_finished()]
        result = _run(run, pool, run_stage)
    for line in result.lines(name):
        run.observers.knob_held(KnobHeld(line))
    record = {**result.record(), STAGE_AFTER_KEY: before}
    record_nccl_stage(run.optuna_study, record)  # the answer names the values it held
    return result.held


def _run(run: RunState, pool: NodePool, run_stage: RunStage) -> stages.StageResult:
    """Run the stage's pass within the study's time and, under a node-hour budget, `STAGE_SHARE` of the
    hours its search may spend; a pass either cuts short holds the knobs it swept whole."""
    study, knobs = run.study, stages.stage_knobs(run.study, run.nvlink)
    left = None if run.deadline is None else max(run.deadline - time.monotonic(), 1e-3)
    jobs = stages.stage_trials(study, run.storage)  # a stage Ctrl-C stopped has jobs already
    job_s = max((TrialRecord.of(t).node_s or 0.0 for t in jobs), default=0.0)
    room = stage_room_s(run)
    why = "the node-hour budget"
    if room is None or room > job_s:
        spent = math.fsum(TrialRecord.of(t).node_s or 0.0 for t in jobs)
        hours = None if room is None else (spent + room) / 3600
        stage = stages.stage_study(study, stages.smallest_gpu_gb(pool), left, hours, nvlink=run.nvlink)
        jobs = run_stage(stage, stages.CoordinateAscent(knobs)).get_trials(deepcopy=False)
        timed_out = run.deadline is not None and time.monotonic() >= run.deadline
        why = "the study's time" if room is None or timed_out else "its share of the node-hour budget"
    result = stages.stage_result(knobs, jobs, shortened=why)
    assert result is not None  # a pass cut short has a result too
    return result
