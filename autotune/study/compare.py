"""Is the best config really better than the default? Both measured again, interleaved, with intervals.

A study's best trial won on one measurement, so its figure is biased upwards (the best of many noisy draws:
small all-reduces vary by a third between launches, a server's throughput by about 0.5% on one H200).
`compare` measures the default (the baseline: nothing set) and the best config again, `rounds` times each,
alternating which goes first (ABBA, so a drift of the node cancels), every run a fresh launch through the
trial path on the study's first node: a job objective's job, or a serving objective's server and
benchmark (its whole measurement plan, no short run first). A round's two runs form a pair; the gain is the
mean of the pairs' relative differences with its 95% interval, in each metric's own direction, and a gain
whose interval contains zero is reported as no gain.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.config import Objective, Study
from autotune.errors import AutotuneError
from autotune.measure.client import BenchmarkResult
from autotune.measure.metrics import OBJECTIVE_METRICS
from autotune.measure.plan import plan_for
from autotune.measure.stats import Gain, MeanCI, mean_ci, paired_gain
from autotune.node.executor import TrialExecutor, fresh_folder, runner_for
from autotune.study.confirm import round_order
from autotune.study.rules import best_trial, trial_config
from autotune.trial.wire import TrialRequest, TrialResult

__all__ = ["Comparison", "Run", "compare", "order_of_round"]

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


def compare(
    study: Study,
    ostudy: optuna.Study,
    rounds: int,
    *,
    trial: int | None = None,
    on_run: Callable[[Run], None] = lambda run: None,
    executor: TrialExecutor | None = None,
) -> Comparison:
    """Measure the default and the best config (or `trial`'s) `rounds` times each, interleaved.

    Runs on the study's first node through a TrialExecutor of its own (logs under the study's
    `compare/` folder), or through `executor`.
    """
    if rounds < 2:
        raise AutotuneError(f"`rounds >= 2` must hold for an interval, but got ({rounds=}).")
    chosen = _chosen_trial(ostudy, trial)
    configs = {DEFAULT: study.search_space.baseline(), BEST: trial_config(study, chosen)}
    launches = {name: study.server_launch(config) for name, config in configs.items()}
    if executor is None:
        node = study.file.nodes[0]
        workdir = fresh_folder(study.workdir / "compare", time.strftime("%Y%m%d-%H%M%S"))
        executor = TrialExecutor(node.name, runner_for(node, workdir), workdir)
    best = configs[BEST]
    comparison = Comparison(
        study.name, study.objective.metric, chosen.number, dict(best.env), best_flags=dict(best.flags)
    )
    objective, job = study.objective, study.objective.is_job
    number = 0
    for index in range(rounds):
        for position, name in enumerate(order_of_round(index)):
            request = TrialRequest(
                number=number,
                launch=launches[name],
                workload=objective.workload,
                startup_timeout_s=study.file.timeouts.startup_s,
                benchmark_timeout_s=study.file.timeouts.benchmark_s,
                seed=index,  # both configs of a round get the same prompts
                plan=None if job else plan_for(objective, short=False),
                job=job,
            )
            number += 1
            run = _run_of(index, name, position, executor.run(request), objective)
            comparison.runs.append(run)
            on_run(run)
    return comparison


def _chosen_trial(ostudy: optuna.Study, number: int | None) -> FrozenTrial:
    if number is None:
        best = best_trial(ostudy)
        if best is None:
            raise AutotuneError(f"study {ostudy.study_name!r} has no completed trial to compare")
        return best
    trials = [t for t in ostudy.get_trials(deepcopy=False) if t.number == number]
    if not trials or trials[0].value is None:
        raise AutotuneError(f"trial {number} of study {ostudy.study_name!r} has no value to compare")
    return trials[0]


def _run_of(index: int, name: str, position: int, result: TrialResult, objective: Objective) -> Run:
    details = result.details or {}
    return Run(
        round=index,
        config=name,
        position=position,
        metrics=_measured(result, objective) if result.ok else {},
        failure=None if result.ok else _failure_text(result),
        timing=details.get("timing"),
        note=details.get("note"),
        elapsed_s=result.benchmark_s or 0.0,
    )


def _measured(result: TrialResult, objective: Objective) -> dict[str, float]:
    """A job's metrics, or a server's: the objective's value and every figure of its benchmark."""
    if result.benchmark is None:
        return dict(result.metrics)
    return {objective.metric: objective.value(result.benchmark), **_figures(result.benchmark)}


def _figures(benchmark: BenchmarkResult) -> dict[str, float]:
    """The benchmark's figures a config changes, each with a better direction (throughputs, latencies)."""
    figures = {}
    for name in OBJECTIVE_METRICS:
        value = getattr(benchmark, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):  # None: a figure it lacks
            figures[name] = float(value)
    return figures


def _failure_text(result: TrialResult) -> str:
    failure = result.failure
    return f"{failure.kind.value}: {failure.line}" if failure is not None else "no result"


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
