"""A node where nothing starts: when the study stops trying, and what it says about a missing baseline.

Asked between trials (`node_failing`): the baseline, SGLang's own defaults, failed in a way that says
nothing about settings (the server never became ready, died, or the node went away), and every launch
after it failed the same way. Each further launch would cost a full start-up time-out (900 s on a real
node) to learn nothing, so the search stops with one sentence of diagnosis, and the CLI exits non-zero
(the baseline never completed: `baseline_missing`). A resumed study whose baseline failed so queues it
again first (`requeue_baseline`), so that a fixed node is seen at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.study.records import TrialRecord
from autotune.study.storage import enqueue_retry, study_lock
from autotune.trial.failures import FailureKind

# Failures of a launch that say nothing about its settings: the node (or its SGLang) cannot serve at all.
NODE_LEVEL = frozenset(
    {
        FailureKind.STARTUP_TIMEOUT,
        FailureKind.SERVER_DIED,
        FailureKind.UNKNOWN_CRASH,
        FailureKind.LAUNCH_ERROR,
        FailureKind.NODE_UNREACHABLE,
        FailureKind.NODE_LOST,
    }
)
# Failures that only a server which served meets.
_SERVED = frozenset({FailureKind.OOM_UNDER_LOAD, FailureKind.BENCHMARK_ERROR, None})
# The baseline and two launches after it: two more chances for a node that was only slow once.
FAILED_LAUNCHES_TO_STOP = 3


@dataclass(frozen=True)
class NodeFailing:
    """The verdict: `launches` launches, the baseline's first, all failed with node-level `kinds` (each
    kind and how often, most frequent first) on `nodes`."""

    launches: int
    kinds: tuple[tuple[FailureKind, int], ...]
    nodes: tuple[str, ...]

    @property
    def text(self) -> str:
        """One sentence: what happened, what it means, what to do."""
        kinds = ", ".join(f"{kind.value} x{n}" for kind, n in self.kinds)
        where = f"node {self.nodes[0]}" if len(self.nodes) == 1 else f"nodes {', '.join(self.nodes)}"
        return (
            f"stopped: no server could run on {where}: the baseline (SGLang's defaults) and "
            f"{self.launches - 1} more launches failed before measuring anything ({kinds}) and none served; "
            f"{_lowered(self.kinds[0][0].advice)}; fix the node or the study's server section, then "
            "resume the study (its baseline runs first)"
        )


def _lowered(sentence: str) -> str:
    """A sentence of advice as a clause of another: no capital, no full stop."""
    return sentence[:1].lower() + sentence[1:].rstrip(".")


def _kind(trial: FrozenTrial) -> FailureKind | None:
    return TrialRecord.of(trial).failure_kind


def node_failing(optuna_study: optuna.Study, since: int = 0) -> NodeFailing | None:
    """The verdict when the study's launches show a node that cannot serve, else None: no launch served
    (launches refused for their settings, e.g. an unknown flag, say nothing either way), the baseline's
    first launch and at least FAILED_LAUNCHES_TO_STOP launches failed with a NODE_LEVEL kind, one of them
    numbered `since` or later (a resume launches once more before it stops: the node may have been fixed),
    and no trial still runs on a node that has not failed yet (another node may serve)."""
    launched = [t for t in optuna_study.get_trials(deepcopy=False) if TrialRecord.of(t).launched]
    failed: list[FrozenTrial] = []
    for trial in launched:
        kind = _kind(trial)
        if trial.state is TrialState.COMPLETE or (trial.state.is_finished() and kind in _SERVED):
            return None  # a server ran and was measured: the node can serve
        if trial.state.is_finished() and kind in NODE_LEVEL:
            failed.append(trial)
    if len(failed) < FAILED_LAUNCHES_TO_STOP or not TrialRecord.of(failed[0]).baseline:
        return None
    if all(t.number < since for t in failed):
        return None
    failed_nodes = {str(TrialRecord.of(t).node) for t in failed}
    running = {str(TrialRecord.of(t).node) for t in launched if t.state is TrialState.RUNNING}
    if running - failed_nodes:
        return None
    kinds = Counter(_kind(t) for t in failed)
    return NodeFailing(
        launches=len(failed),
        kinds=tuple((kind, n) for kind, n in kinds.most_common() if kind is not None),
        nodes=tuple(sorted(failed_nodes)),
    )


def requeue_baseline(study: Study, optuna_study: optuna.Study) -> int | None:
    """Queue the baseline again when it never completed and its last launch failed with a NODE_LEVEL kind
    (a resume after the node was fixed); returns the failed trial's number. A baseline that failed for its
    settings (out of memory) would fail again: not queued."""
    with study_lock(study):
        baselines = [t for t in optuna_study.get_trials(deepcopy=False) if TrialRecord.of(t).baseline]
        done = [t for t in baselines if t.state.is_finished() and t.state is not TrialState.COMPLETE]
        if not baselines or len(done) < len(baselines):  # none yet, one completed, or one waiting or running
            return None
        last = baselines[-1]
        if _kind(last) not in NODE_LEVEL:
            return None
        enqueue_retry(optuna_study, last.number, {}, TrialRecord.of(last), once=False)
        return last.number


def baseline_missing(optuna_study: optuna.Study, study_file: Path) -> str | None:
    """The sentence that ends a run whose baseline never completed (None when it did): the study has no
    reference to measure a gain against, so it has no answer."""
    baselines = [t for t in optuna_study.get_trials(deepcopy=False) if TrialRecord.of(t).baseline]
    if any(t.state is TrialState.COMPLETE for t in baselines):
        return None
    last = next((t for t in reversed(baselines) if t.state.is_finished()), None)
    if last is None:
        return (
            f"no answer: the baseline (SGLang's defaults) never ran; run `autotune resume {study_file}` "
            "to run it"
        )
    kind = _kind(last)
    how = f"failed ({kind.value})" if kind is not None else f"ended {last.state.name}"
    if kind in NODE_LEVEL:
        fix = f"fix the node or the study's server section, then `autotune resume {study_file}` runs it first"
    else:  # a failure of the defaults themselves would repeat: it is not queued again
        fix = "change what made SGLang's defaults fail (server section, objective), then start a new study"
    return (
        f"no answer: the baseline (SGLang's defaults, trial {last.number}) {how}, so no gain can be "
        f"measured; see why with `autotune status {study_file}`, {fix}"
    )
