"""What trustworthy measurement costs and buys, on the simulated node's model.

1. Short-first: the node time a study spends with and without a short measurement first (Optuna's
   PercentilePruner stopping the configs whose short result is in the worse half), and the best config
   each finds, over several seeds of a 50-trial study.
2. Re-measurement: under run-to-run noise, how often the config with the best single measurement differs
   from the best mean after re-measuring the top 3 configs 3 times (and the baseline), and what each
   winner is truly worth (the model's noise-free value) against its claimed gain.

Studies run through the product's `StudyDriver` on `ModelNodeExecutor` nodes with an in-memory Optuna storage
and no MLflow, like `sample_efficiency.py`; node time is the model's start-up plus benchmark seconds.

    python benchmarks/measurement.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FixedTrial

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import NODE, PROFILES, SEARCH_SPACE, Profile, save_study

from autotune.config import Study
from autotune.node.pool import LocalNodePool
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study import optuna_internals
from autotune.study.loop import StudyDriver
from autotune.study.records import BASELINE_ATTR, PRUNED_BY_ATTR, REMEASURE_OF_ATTR
from autotune.study.remeasure import remeasure, remeasured_answer
from autotune.study.rules import best_trial, measurement_groups
from autotune.trial.wire import TrialRequest, TrialResult

PROMPTS_PER_CONCURRENCY = 8  # a full measurement of 8 rounds of requests, its short run 2


class ClockedNode(ModelNodeExecutor):
    """A model node that adds up each trial's node time (start-up plus every benchmark of its plan).

    The driver seeds a trial's noise with its number, so trial 0 (the baseline) would draw the same noise in
    every study; `noise_seed` shifts the draws of each study."""

    def __init__(self, profile: Profile, noise: float = 0.0, noise_seed: int = 0) -> None:
        hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
        super().__init__(NODE, hardware, model, noise)
        self.seconds: dict[int, float] = {}
        self.noise_seed = noise_seed

    def run(self, request: TrialRequest) -> TrialResult:
        if request.plan is None:  # one run of a plan, already shifted
            return super().run(request)
        result = super().run(replace(request, seed=request.seed + 100_000 * self.noise_seed))
        self.seconds[request.number] = (result.startup_s or 0.0) + (result.benchmark_s or 0.0)
        return result


def write_study(folder: Path, profile: Profile, n_trials: int, seed: int, objective: dict[str, Any]) -> Study:
    (folder / "objective.yaml").write_text(yaml.safe_dump(objective, sort_keys=False))
    data = {
        "study": f"measurement-{profile.key}",
        "search_space": str(SEARCH_SPACE),
        "objective": "objective.yaml",
        "server": {
            "command": ["python", "-m", "sglang.launch_server"],
            "model_path": profile.model_path,
            "draft_model_path": profile.draft_model_path,
            "flags": {"--tp-size": 8},
        },
        "budget": {"n_trials": n_trials},
        "sampler": {"name": "tpe", "seed": seed},
    }
    return save_study(folder, data)


def base_objective(profile: Profile) -> dict[str, Any]:
    shipped = yaml.safe_load(profile.objective.read_text())
    workload = dict(shipped["workload"])
    workload["num_prompts"] = PROMPTS_PER_CONCURRENCY * workload["concurrency"]
    return {"name": "measurement", "metric": "output_throughput", "workload": workload}


def run(study: Study, node: ClockedNode) -> optuna.Study:
    driver = StudyDriver(
        study,
        pool=lambda _: LocalNodePool({NODE: node}),
        storage=optuna.storages.InMemoryStorage(),
    )
    return driver.run()


@dataclass
class ShortFirstRow:
    node_h: float
    pruned_by_short: int
    best: float


def short_first(profile: Profile, seed: int, n_trials: int, short: bool, ladder: bool) -> ShortFirstRow:
    objective = base_objective(profile)
    if ladder:  # four loads on each launch, the workload's concurrency the top one
        top = objective["workload"]["concurrency"]
        levels = [max(1, top // 8), max(2, top // 4), max(3, top // 2), top]
        objective["ladder"] = {
            "concurrency": sorted(set(levels)),
            "combine": "mean",
            "prompts_per_concurrency": PROMPTS_PER_CONCURRENCY,
        }
    if short:
        objective["short_first"] = {"fraction": 0.25, "keep_top_pct": 50, "min_trials": 5}
    with tempfile.TemporaryDirectory() as folder:
        study = write_study(Path(folder), profile, n_trials, seed, objective)
        node = ClockedNode(profile)
        optuna_study = run(study, node)
    best = best_trial(optuna_study)
    return ShortFirstRow(
        node_h=sum(node.seconds.values()) / 3600,
        pruned_by_short=sum(1 for t in optuna_study.trials if t.user_attrs.get(PRUNED_BY_ATTR)),
        best=best.value if best is not None and best.value is not None else 0.0,
    )


@dataclass
class RemeasureRow:
    differs: bool
    single_true_gain: float  # % over the baseline's noise-free value
    single_claimed_gain: float
    remeasured_true_gain: float
    remeasured_claimed_gain: float
    within_noise: bool
    ci_width_pct: float  # of the best mean
    extra_trials: int


def true_value(study: Study, profile: Profile, params: dict[str, Any] | None) -> float:
    """The model's noise-free output tok/s of a config (None: the baseline)."""
    space = study.search_space
    config = space.baseline() if params is None else space.suggest(FixedTrial(params))
    w = study.objective.workload
    assert w is not None, f"{profile.objective} is a serving objective with a workload"
    request = TrialRequest(0, study.server_launch(config), w, 1.0, 1.0)
    result = ModelNodeExecutor(
        NODE, load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    ).run(request)
    return result.benchmark.output_throughput if result.benchmark is not None else 0.0


def remeasured(profile: Profile, seed: int, n_trials: int, noise: float) -> RemeasureRow | None:
    objective = {**base_objective(profile), "remeasure": {"top": 3, "repeats": 3}}
    with tempfile.TemporaryDirectory() as folder:
        study = write_study(Path(folder), profile, n_trials, seed, objective)
        node = ClockedNode(profile, noise, noise_seed=seed)
        optuna_study = run(study, node)
        single = best_trial(optuna_study)
        optuna_study = remeasure(study, optuna_study, lambda total: _run_to(study, node, optuna_study, total))
        answer = remeasured_answer(optuna_study)
    if single is None or answer is None or answer.baseline is None or answer.gain is None:
        return None
    by_number = {t.number: t for t in optuna_study.trials}
    base_true = true_value(study, profile, None)
    base_single = next(t for t in optuna_study.trials if t.user_attrs.get(BASELINE_ATTR)).value or 0.0

    def true_gain(number: int) -> float:
        trial = by_number[number]
        params = None if trial.user_attrs.get(BASELINE_ATTR) else dict(trial.params)
        return (true_value(study, profile, params) / base_true - 1) * 100

    groups = {g.of: g for g in measurement_groups(optuna_study)}
    single_group = next(g for g in groups.values() if single.number in g.trials)
    interval = answer.best.interval or (answer.best.mean, answer.best.mean)
    return RemeasureRow(
        differs=single_group.of != answer.best.of,
        single_true_gain=true_gain(single.number),
        single_claimed_gain=((single.value or 0.0) / base_single - 1) * 100,
        remeasured_true_gain=true_gain(answer.best.of),
        remeasured_claimed_gain=answer.gain.pct,
        within_noise=answer.gain.within_noise,
        ci_width_pct=(interval[1] - interval[0]) / answer.best.mean * 100,
        extra_trials=sum(1 for t in optuna_study.trials if REMEASURE_OF_ATTR in t.user_attrs),
    )


def _run_to(study: Study, node: ClockedNode, optuna_study: optuna.Study, total: int) -> optuna.Study:
    """Continue the same in-memory study to `total` trials (the re-measurements queued in it)."""
    driver = StudyDriver(
        study,
        pool=lambda _: LocalNodePool({NODE: node}),
        storage=optuna_internals.storage_of(optuna_study),
    )
    return driver.run(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few seeds, few trials")
    args = parser.parse_args()
    seeds = range(2) if args.quick else range(8)
    n_trials = 12 if args.quick else 50
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    print(f"## Short measurement first: {n_trials}-trial studies, {len(seeds)} seeds, TPE")
    print(
        f"Full measurement: {PROMPTS_PER_CONCURRENCY} x concurrency prompts; short: a quarter of them; "
        "pruned when not in the best half of complete trials' short results (after 5 complete).\n"
    )
    print(
        "| profile | node h, full only | node h, short first | saved | pruned by short "
        "| best, short first / full only |"
    )
    print("|---|---|---|---|---|---|")
    for profile, ladder in [(p, ladder) for p in PROFILES.values() for ladder in (False, True)]:
        plain = [short_first(profile, seed, n_trials, short=False, ladder=ladder) for seed in seeds]
        short = [short_first(profile, seed, n_trials, short=True, ladder=ladder) for seed in seeds]
        plain_h = statistics.mean(r.node_h for r in plain)
        short_h = statistics.mean(r.node_h for r in short)
        best_ratio = statistics.mean(s.best / p.best for s, p in zip(short, plain, strict=True) if p.best)
        print(
            f"| {profile.key}{', 4-level ladder' if ladder else ''} | {plain_h:.2f} | {short_h:.2f} | "
            f"{(1 - short_h / plain_h) * 100:.0f}% | "
            f"{statistics.mean(r.pruned_by_short for r in short):.1f} | {best_ratio:.3f} |"
        )

    print(
        f"\n## Re-measurement under noise: {n_trials}-trial studies, top 3 and the baseline measured 3 times"
    )
    print(
        "| profile | noise | winner differs | true gain, single winner | its claimed gain | true gain, "
        "re-measured winner | its claimed gain | within noise | 95% CI width | extra trials |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for profile in PROFILES.values():
        for noise in (0.03, 0.05):
            rows = [r for seed in seeds if (r := remeasured(profile, seed, n_trials, noise)) is not None]
            if not rows:
                continue
            print(
                f"| {profile.key} | {noise:.0%} | {sum(r.differs for r in rows)}/{len(rows)} | "
                f"{statistics.mean(r.single_true_gain for r in rows):+.1f}% | "
                f"{statistics.mean(r.single_claimed_gain for r in rows):+.1f}% | "
                f"{statistics.mean(r.remeasured_true_gain for r in rows):+.1f}% | "
                f"{statistics.mean(r.remeasured_claimed_gain for r in rows):+.1f}% | "
                f"{sum(r.within_noise for r in rows)}/{len(rows)} | "
                f"{statistics.mean(r.ci_width_pct for r in rows):.1f}% | "
                f"{statistics.mean(r.extra_trials for r in rows):.1f} |"
            )


if __name__ == "__main__":
    main()
