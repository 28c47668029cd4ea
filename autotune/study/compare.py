"""Is the best config really better than the default? Both measured again, interleaved, with intervals.

The best trial won on one measurement, biased upwards, so `compare` launches the default and the best
config again in alternating rounds (ABBA: a drift of the node cancels), as study trials, and reports the
mean of the pairs' gains with its 95% interval; an interval that holds zero is no gain. Details, and the
noise behind it: docs/design.md, "Compare".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.errors import AutotuneError
from autotune.measure.metrics import OBJECTIVE_METRICS
from autotune.measure.stats import Gain, MeanCI, mean_ci, paired_gain
from autotune.study.records import CompareMark, StudyRecord, TrialRecord, record_compares
from autotune.study.remeasure import enqueue_measurement
from autotune.study.rules import best_trial, is_feasible, measurement_groups, trial_config
from autotune.study.storage import budget_used, counts
from autotune.study.trust.confirm import round_order

__all__ = ["Comparison", "Run", "compare", "comparison_of", "order_of_round", "queue_rounds"]

DEFAULT, BEST = "default", "best"


def order_of_round(index: int) -> tuple[str, str]:
    """ABBA: default first in rounds 0, 3, 4, 7, ...; best first in rounds 1, 2, 5, 6, ... (the order a
    study's confirmation rounds take too: study.confirm.round_order)."""
    first, second = round_order(index, (DEFAULT, BEST))
    return first, second


@dataclass(frozen=True)
class Run:
    """One measurement: which config, in which round and position, and its metrics or its failure."""

    round: int
    config: str
    position: int
    metrics: dict[str, float]
    failure: str | None = None
    timing: str | None = None
    note: str | None = None
    elapsed_s: float = 0.0


@dataclass
class Comparison:
    """The runs of a comparison, and the paired gains of the best config over the default."""

    study: str
    metric: str
    best_trial: int
    best_env: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    best_flags: dict[str, str | None] = field(default_factory=dict)

    def pairs(self) -> list[tuple[Run, Run]]:
        """(default, best) of each round where both succeeded."""
        by_round: dict[int, dict[str, Run]] = {}
        for run in self.runs:
            if run.failure is None:
                by_round.setdefault(run.round, {})[run.config] = run
        return [(r[DEFAULT], r[BEST]) for _, r in sorted(by_round.items()) if DEFAULT in r and BEST in r]

    def metrics(self) -> list[str]:
        """The objective's metric, each message size's latency, then the other figures with a better
        direction (a job's memory; a server's throughputs and latencies): those every pair has."""
        pairs = self.pairs()
        if not pairs:
            return []
        common = set.intersection(*(set(d.metrics) & set(b.metrics) for d, b in pairs))
        sizes = sorted(m for m in common if m.startswith("allreduce_us.") and m != self.metric)
        ordered = [self.metric, *sizes, *OBJECTIVE_METRICS]
        return [m for m in dict.fromkeys(ordered) if m in common]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per metric: each config's mean and interval over the rounds, and the paired gain."""
        pairs = self.pairs()
        out: dict[str, dict[str, Any]] = {}
        if len(pairs) < 2:
            return out
        for metric in self.metrics():
            default = [d.metrics[metric] for d, _ in pairs]
            best = [b.metrics[metric] for _, b in pairs]
            gain = paired_gain(default, best, minimize=_lower_is_better(metric))
            out[metric] = {
                "default": _ci(mean_ci(default)),
                "best": _ci(mean_ci(best)),
                "gain_pct": gain.percent.mean,
                "gain_ci95_pct": gain.percent.half_width,
                "difference": _ci(gain.difference),
                "verdict": gain.verdict,
                "text": gain.describe(),
            }
        return out

    def gain(self, metric: str | None = None) -> Gain | None:
        """The paired gain in `metric` (the objective's by default); None with fewer than two pairs."""
        pairs = self.pairs()
        if len(pairs) < 2:
            return None
        name = metric or self.metric
        return paired_gain(
            [d.metrics[name] for d, _ in pairs],
            [b.metrics[name] for _, b in pairs],
            minimize=_lower_is_better(name),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "study": self.study,
                "metric": self.metric,
                "best_trial": self.best_trial,
                "best_env": self.best_env,
                "best_flags": self.best_flags,
                "pairs": len(self.pairs()),
                "summary": self.summary(),
                "runs": [asdict(run) for run in self.runs],
            },
            indent=2,
        )

    def table(self) -> str:
        """The summary as aligned text, one line per metric."""
        summary = self.summary()
        if not summary:
            return f"fewer than two rounds where both configs completed ({len(self.pairs())}): no comparison"
        lines = [f"{'metric':<26} {'default':>22} {'best':>22}  best vs default"]
        for metric, row in summary.items():
            lines.append(f"{metric:<26} {_text(row['default']):>22} {_text(row['best']):>22}  {row['text']}")
        return "\n".join(lines)


def _lower_is_better(metric: str) -> bool:
    """A metric's direction from the catalogue; a message size's latency (`allreduce_us.<size>`) is lower."""
    better = OBJECTIVE_METRICS.get(metric)
    return better == "minimize" if better is not None else metric.startswith("allreduce_us.")


def _ci(ci: MeanCI) -> dict[str, float]:
    return {"mean": ci.mean, "ci95": ci.half_width, "n": ci.n}


def _text(ci: dict[str, float]) -> str:
    half = "" if math.isnan(ci["ci95"]) else f" ± {ci['ci95']:.2f}"
    return f"{ci['mean']:.2f}{half}"


def queue_rounds(
    study: Study, optuna_study: optuna.Study, rounds: int, trial: int | None = None
) -> dict[str, Any]:
    """Queue `rounds` rounds of the defaults and the best config (or `trial`'s) as study trials, and
    remember the comparison in the study; a comparison of the same config and rounds that did not finish
    is continued instead (its rounds are not queued again). Returns the comparison's record."""
    if rounds < 2:
        raise AutotuneError(f"`rounds >= 2` must hold for an interval, but got ({rounds=}).")
    chosen = _chosen_trial(optuna_study, trial)
    records = StudyRecord.of(optuna_study).compares
    if records and (last := records[-1])["trial"] == chosen.number and last["rounds"] == rounds:
        if len(_rounds_of(optuna_study, int(last["id"]))) < 2 * rounds:
            return dict(last)  # cut short: its queued (or interrupted, queued again) rounds run on
    groups = measurement_groups(optuna_study)
    base = next((g for g in groups if g.baseline), None)
    best = next((g for g in groups if chosen.number in (g.of, *g.trials)), None)
    if base is None or best is None:
        raise AutotuneError(f"study {optuna_study.study_name!r} has no baseline measured to compare against")
    record = {"id": len(records), "trial": chosen.number, "rounds": rounds}
    for index in range(rounds):
        for position, name in enumerate(order_of_round(index)):
            mark = CompareMark(id=len(records), round=index, position=position, config=name)
            enqueue_measurement(optuna_study, base if name == DEFAULT else best, compare=mark)
    record_compares(optuna_study, [*records, record])
    return record


def _rounds_of(optuna_study: optuna.Study, compare_id: int) -> list[FrozenTrial]:
    """The finished measurements of comparison `compare_id` (not one a Ctrl-C cut short: it runs again)."""
    return [
        t
        for t in optuna_study.get_trials(deepcopy=False)
        if (mark := TrialRecord.of(t).compare) is not None
        and mark["id"] == compare_id
        and t.state.is_finished()
        and counts(t)
    ]


def comparison_of(study: Study, optuna_study: optuna.Study, record: dict[str, Any]) -> Comparison:
    """The comparison `record` as its trials measured it (a view: the runs are the study's trials)."""
    chosen = _chosen_trial(optuna_study, int(record["trial"]))
    best = trial_config(study, chosen)
    comparison = Comparison(
        study.name, study.objective.metric, chosen.number, dict(best.env), best_flags=dict(best.flags)
    )
    measured = _rounds_of(optuna_study, int(record["id"]))
    for trial in sorted(measured, key=lambda t: (_mark(t)["round"], t.number)):
        comparison.runs.append(_run_of(study, trial))
    return comparison


def compare(
    study: Study,
    optuna_study: optuna.Study,
    rounds: int,
    *,
    trial: int | None = None,
    on_run: Callable[[Run], None] = lambda run: None,
    run: Callable[[int], optuna.Study] | None = None,
) -> Comparison:
    """Measure the default and the best config (or `trial`'s) `rounds` times each, interleaved, as trials of
    the study (`queue_rounds`): they resume after Ctrl-C, are tracked as any trial and feed the noise
    estimate. `run(total_budget)` runs the queued trials (a study driver made with `queued_only`); by
    default one on the study's nodes from this process, without tracking."""
    record = queue_rounds(study, optuna_study, rounds, trial)
    if run is None:
        from autotune.node.pool import in_process_pool  # the driver's default pool would start Ray
        from autotune.study.loop import StudyDriver

        def run(total: int) -> optuna.Study:
            return StudyDriver(study, pool=in_process_pool, queued_only=True).run(total)

    waiting = len(optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if waiting:
        optuna_study = run(budget_used(optuna_study) + waiting)
    comparison = comparison_of(study, optuna_study, record)
    for measured in comparison.runs:
        on_run(measured)
    return comparison


def _chosen_trial(optuna_study: optuna.Study, number: int | None) -> FrozenTrial:
    if number is None:
        best = best_trial(optuna_study)
        if best is None:
            raise AutotuneError(f"study {optuna_study.study_name!r} has no completed trial to compare")
        return best
    trials = [t for t in optuna_study.get_trials(deepcopy=False) if t.number == number]
    if not trials or trials[0].value is None:
        raise AutotuneError(f"trial {number} of study {optuna_study.study_name!r} has no value to compare")
    return trials[0]


def _mark(trial: FrozenTrial) -> CompareMark:
    mark = TrialRecord.of(trial).compare
    assert mark is not None  # one of a comparison's measurements (_rounds_of)
    return mark


def _run_of(study: Study, trial: FrozenTrial) -> Run:
    mark = _mark(trial)
    value = trial.value if trial.state == TrialState.COMPLETE and is_feasible(trial) else None
    metrics = {study.objective.metric: value, **TrialRecord.of(trial).metrics} if value is not None else {}
    return Run(
        round=mark["round"],
        config=mark["config"],
        position=mark["position"],
        metrics=metrics,
        failure=None if value is not None else _failure_text(trial),
        elapsed_s=TrialRecord.of(trial).node_s or 0.0,
    )


def _failure_text(trial: FrozenTrial) -> str:
    record = TrialRecord.of(trial)
    if record.failure_kind_text is None:
        return "broke a limit" if trial.state == TrialState.COMPLETE else "no result"
    return f"{record.failure_kind_text}: {record.failure or ''}"


def write(comparison: Comparison, path: Path) -> Path:
    """Write the comparison's JSON to `path` (folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(comparison.to_json())
    return path


def describe_run(run: Run, metric: str) -> str:
    """One line per run, for the console."""
    if run.failure is not None:
        return f"round {run.round} {run.config:<7} FAILED {run.failure[:120]}"
    value = run.metrics.get(metric)
    timing = f" ({run.timing})" if run.timing and run.timing != "cuda_graph" else ""
    shown = f"{metric} {value:.2f}" if value is not None else "-"
    memory = run.metrics.get("nccl_memory_mib")
    mem = f", NCCL {memory:.0f} MiB" if memory is not None else ""
    return f"round {run.round} {run.config:<7} {shown}{mem}{timing}  [{run.elapsed_s:.1f} s]"
