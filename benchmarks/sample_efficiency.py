"""Sample efficiency: how close each way of tuning gets to the best known config for a budget of trials,
and how much node time it spends getting there, failed trials included.

Every method runs whole studies through autotune's study loop on the simulated node's model (a trial is
the model's answer: no process, no sleep), so all of them live under the product's outcome rules: an OOM
is a pruned trial with the penalty, an unsupported flag is remembered and never launched again, and a
proposal refused as known-incompatible costs neither budget nor node time. The methods:

- autotune's default (what a study file gets without `sampler.name`): its NCCL all-reduce stage
  (autotune.study.stages: coordinate ascent over the NCCL knobs on the messages the server will
  all-reduce, 30 s of node time a trial on the model node) and then the server trials, which hold the
  stage's best; the stage's node time is counted with the first trial's;
- random search (Optuna's RandomSampler), also with twice the budget;
- a grid over two flags with every other knob at its default, as vLLM's auto_tune does;
- one group of knobs at a time: NCCL, then SGLang's flags, then speculation, each with a third of the
  budget, random within the group, the groups tuned before it fixed at the best trial's values;
- with `--samplers tpe/no-stage`: the default without its NCCL stage (`nccl_stage: off`).

Random search, the grid and one group at a time run without the NCCL stage, as other tools run them.

A profile is a shipped one (seed: the node and model of the session the simulator is calibrated on, see
docs/concepts.md; h200) or a YAML file (benchmarks/profiles/): hardware and model
profiles, the objective, and the layout (--tp-size: the node's GPUs unless it says; --dp-size replicas);
the search space's --ep-size choices follow the --tp-size.

A sequential study's first k trials do not depend on its budget, so the budget-free methods run once per
seed to the largest budget and are read at each budget; the grid and the group plan depend on the budget
and run once per budget. Node time is the model's: start-up until the server is ready or dies, plus the
benchmark (teardown, 10-15 s per launch on SGLang, is not counted for any method).

The best known config of each profile is the best of a large random sample of the shipped search space
(the model's own answer for each), refined by coordinate ascent; it is cached in best_known.json beside
this script and searched again when the model's answer for it changes, or with --recompute-best.

    python benchmarks/sample_efficiency.py            # both profiles, budgets 10 20 40 80, 10 seeds
    python benchmarks/sample_efficiency.py --profiles seed,h200,benchmarks/profiles/h100x4-llama70b.yaml
    python benchmarks/sample_efficiency.py --samplers tpe-plain,tpe/no-moves   # more to compare
    python benchmarks/sample_efficiency.py --quick    # smoke run: seed profile, budgets 4 8, 2 seeds
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

import optuna
from model_studies import (
    BENCHMARKS,
    PROFILES,
    Landscape,
    Params,
    Profile,
    StudyRun,
    load_profile,
    parameter_values,
    run_study,
    search_space_for,
    studies_in_pool,
)
from tuning_methods import OneGroupAtATime, TwoFlagGrid, grid_points, stage_sizes

from autotune.config import SearchSpace, Study, parse_search_space
from autotune.config.study import SamplerSpec
from autotune.errors import AutotuneError, ConfigError
from autotune.sim.model_node import node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study import samplers
from autotune.study.preflight import predicted_oom
from autotune.study.samplers import SAMPLERS
from autotune.trial.memory_fraction import MEM_FRACTION

BEST_KNOWN = BENCHMARKS / "best_known.json"
RECOMPUTE = "python benchmarks/sample_efficiency.py --recompute-best"
BEST_SAMPLES, BEST_ASCENTS = 2000, 6
QUICK_SAMPLES, QUICK_ASCENTS = 150, 0
GRAPH_BS = "--cuda-graph-max-bs-decode"
GROUP_ORDER = ("nccl", "sglang", "speculative")
MUST_BUDGET, MUST_WITHIN, MAX_FAILED = 40, 0.95, 0.05
DEFAULT_SAMPLER = SamplerSpec().name
NO_STAGE = "tpe/no-stage"  # the default without its NCCL all-reduce stage (`nccl_stage: off`)


def _tpe_variant(**settings: Any) -> Callable[[int | None], optuna.samplers.BaseSampler]:
    """autotune's default sampler with other settings (see autotune.study.samplers.tpe)."""
    return lambda seed: samplers.tpe(seed, **settings)


# Settings of the default sampler tried against it (--samplers tpe/start5,...); the product's registry
# (autotune.study.samplers.SAMPLERS) names the others.
VARIANTS: Mapping[str, Callable[[int | None], optuna.samplers.BaseSampler]] = {
    "tpe/start5": _tpe_variant(n_startup_trials=5),
    "tpe/start20": _tpe_variant(n_startup_trials=20),
    "tpe/keep0.5": _tpe_variant(keep_default=0.5),
    "tpe/keep0.9": _tpe_variant(keep_default=0.9),
    "tpe/independent": _tpe_variant(multivariate=False, group=False),
    "tpe/ei128": _tpe_variant(n_ei_candidates=128),
    "tpe/no-feasibility": _tpe_variant(feasibility_weight=0.0, moves=0.0),  # the default before c-TPE's term
    "tpe/no-moves": _tpe_variant(moves=0.0),  # the default before moves from the best trial and repairs
    "tpe/moves0.5": _tpe_variant(moves=0.5),
    "tpe/no-branches": _tpe_variant(branch_trials=0),  # without speculation's own trials
    "tpe/no-floor": _tpe_variant(floor=False),  # without the floor on the memory fraction
    "tpe/no-climb": _tpe_variant(climb=False),  # without the line search along range knobs (issue 37)
    # Oracles, not methods: the default told the seed's best known speculative mode, and its NCCL transport.
    "tpe/oracle-eagle3": lambda seed: optuna.samplers.PartialFixedSampler(
        {"--speculative-algorithm": "EAGLE3"}, samplers.tpe(seed)
    ),
    "tpe/oracle-eagle3-p2p": lambda seed: optuna.samplers.PartialFixedSampler(
        {"--speculative-algorithm": "EAGLE3", "NCCL_P2P_LEVEL": "SYS"}, samplers.tpe(seed)
    ),
}


# -- the best known config ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BestKnown:
    """The best config found for a profile, the baseline's value, and SGLang's own memory fraction."""

    tok_s: float
    params: Params
    baseline: float
    auto_mem_fraction: float  # SGLang's --mem-fraction-static for the baseline, on the search space's steps
    how: str
    cache_entry: dict[str, Any] | None = None  # what to write to best_known.json, when it was searched


def find_best_known(
    profile: Profile, cached: dict[str, Any] | None, recompute: bool, quick: bool
) -> BestKnown:
    """The cached best config while the model still gives it the same value; else a new search."""
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        landscape = Landscape(profile, Path(folder))
        baseline = landscape.value_of(landscape.space.baseline())
        steps = parameter_values(landscape.space, MEM_FRACTION)
        auto = landscape.baseline_plan().mem_fraction_static
        auto = min(steps, key=lambda step: abs(step - auto))
        if cached and not recompute and abs(landscape.value(cached["params"]) - cached["tok_s"]) < 1e-6:
            how = f"{cached['how']}; cached in {BEST_KNOWN.name} on {cached['date']}"
            return BestKnown(cached["tok_s"], cached["params"], baseline, auto, how)
        if cached and not recompute:
            print(f"[{profile.key}] the model's answer for the cached best config changed: searching again")
        samples, ascents = (QUICK_SAMPLES, QUICK_ASCENTS) if quick else (BEST_SAMPLES, BEST_ASCENTS)
        started = time.monotonic()
        tok_s, params = landscape.search(samples, ascents)
        how = (
            f"coordinate ascent (one parameter, or the speculative group, at a time) from the {ascents} best "
            f"of {samples} random configs of the shipped search space, half of them near the defaults "
            if ascents
            else f"the best of {samples} random configs of the shipped search space "
        ) + f"({landscape.evaluations} launches asked, {time.monotonic() - started:.0f} s)"
        return _found(tok_s, params, baseline, auto, how, quick)


def improve_best_known(profile: Profile, best: BestKnown, params: Params) -> BestKnown:
    """A study found a config better than the best known: coordinate ascent from it gives the new one."""
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        landscape = Landscape(profile, Path(folder))
        tok_s, params = landscape.search(0, 0, starts=[params])
    how = f"coordinate ascent from the best trial of these studies, which beat the search ({best.how})"
    return _found(tok_s, params, best.baseline, best.auto_mem_fraction, how, quick=False)


def _found(tok_s: float, params: Params, baseline: float, auto: float, how: str, quick: bool) -> BestKnown:
    if quick:
        return BestKnown(tok_s, params, baseline, auto, how + "; a quick estimate (--quick), not cached")
    entry = {"tok_s": tok_s, "params": params, "how": how, "date": str(date.today())}
    return BestKnown(tok_s, params, baseline, auto, how, entry)


# -- methods and jobs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One study: a method on a profile with a seed, run for `n_trials` (the largest budget it is read at,
    or, for a method planned for its budget, that budget)."""

    profile: Profile
    method: str
    seed: int
    n_trials: int
    auto_mem_fraction: float


def grid_plan(space: SearchSpace, budget: int, profile: Profile) -> list[dict[str, Any]]:
    """The grid's points for a budget (the baseline takes one trial): memory fraction x graph batch size,
    over the fractions the pre-flight check lets launch (the study loop would refuse the others at no
    cost, and a grid point refused is not a grid point tried)."""
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    facts = node_report("node", hardware, model)

    def launches(fraction: float) -> bool:
        flags = (("--tp-size", str(profile.tp)), (MEM_FRACTION, str(fraction)))  # the study's --tp-size
        return predicted_oom(flags, facts.gpu_memory_gb, model.weight_gb) is None

    graph_sizes = [v for v in parameter_values(space, GRAPH_BS) if v is not None]
    mem_fractions = [f for f in parameter_values(space, MEM_FRACTION) if launches(f)]
    return grid_points((MEM_FRACTION, mem_fractions), (GRAPH_BS, graph_sizes), budget - 1)


def run_job(job: Job) -> tuple[Job, StudyRun]:
    """Run one job; its error comes back to the parent with the job and the worker's traceback."""
    try:
        return _run_job(job)
    except Exception:
        raise RuntimeError(f"{job} failed:\n{traceback.format_exc()}") from None


def _run_job(job: Job) -> tuple[Job, StudyRun]:
    profile, defaults = job.profile, {MEM_FRACTION: job.auto_mem_fraction}
    if job.method == "grid":
        space = parse_search_space(search_space_for(profile), f"the search space for {profile.key}")
        points = grid_plan(space, job.n_trials, profile)
        # The study's budget is the grid's size: a budget the grid cannot fill leaves trials unused. The
        # plan holds only what the pre-flight check lets launch; a refusal of the study's own (a KV pool the
        # baseline's memory report bounds too small) would hold the grid at its point for good.
        grid = TwoFlagGrid(points, defaults)
        return job, run_study(
            profile, 1 + len(points), sampler=lambda _study: grid, nccl_stage=False, preflight=False
        )
    if job.method == "groups":

        def groups(study: Study) -> optuna.samplers.BaseSampler:
            kinds = {name: p.kind for name, p in study.search_space.parameters.items()}
            sizes = stage_sizes(job.n_trials - 1, len(GROUP_ORDER))
            return OneGroupAtATime(kinds, GROUP_ORDER, sizes, defaults, seed=job.seed)

        return job, run_study(profile, job.n_trials, sampler=groups, seed=job.seed, nccl_stage=False)
    if job.method == NO_STAGE:
        return job, run_study(profile, job.n_trials, seed=job.seed, nccl_stage=False)
    if job.method in VARIANTS:
        variant = VARIANTS[job.method]
        return job, run_study(profile, job.n_trials, sampler=lambda _study: variant(job.seed), seed=job.seed)
    plain = job.method == "random"  # random search as a method, not the product with a random sampler
    return job, run_study(profile, job.n_trials, sampler_name=job.method, seed=job.seed, nccl_stage=not plain)


def plan_jobs(
    profiles: Sequence[Profile],
    budgets: Sequence[int],
    seeds: int,
    extra: Sequence[str],
    best: dict[str, BestKnown],
    others: bool = True,
) -> list[Job]:
    """The studies to run; without `others`, autotune's samplers alone (no random search, grid or groups)."""
    top, jobs = max(budgets), []
    for profile in profiles:
        auto = best[profile.key].auto_mem_fraction
        for seed in range(seeds):
            if others:
                jobs.append(Job(profile, "random", seed, 2 * top, auto))
            for name in dict.fromkeys([DEFAULT_SAMPLER, *extra]):
                jobs.append(Job(profile, name, seed, top, auto))
            if others:
                jobs += [Job(profile, "groups", seed, budget, auto) for budget in budgets]
        if others:
            jobs += [Job(profile, "grid", 0, budget, auto) for budget in budgets]  # no randomness: one run
    return jobs


def best_trial_of(runs: list[tuple[Job, StudyRun]], key: str) -> tuple[float, Params]:
    """The best value any study of a profile found, and its trial's parameters."""
    found = [
        (v, p)
        for job, run in runs
        if job.profile.key == key
        for v, p in zip(run.values, run.params, strict=True)
    ]
    return max(((v, p) for v, p in found if v is not None), key=lambda pair: pair[0], default=(0.0, {}))


# -- tables ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One method at one budget over the seeds: best/best-known ratios, node hours, failed node hours."""

    ratios: list[float]
    hours: list[float]
    failed_hours: list[float]
    trials: int

    def ratio_text(self) -> str:
        r = self.ratios
        if len(r) == 1:
            return f"{r[0]:.3f}"
        return f"{statistics.median(r):.3f} [{min(r):.2f}-{max(r):.2f}]"

    def hours_text(self) -> str:
        hours = statistics.median(self.hours)
        failed = statistics.median(self.failed_hours)
        return f"{hours:6.1f} h ({failed / hours:4.0%} failed)" if hours else "0.0 h"


def cells(
    runs: list[tuple[Job, StudyRun]], key: str, budgets: Sequence[int], reference: float, extra: Sequence[str]
) -> dict[str, dict[int, Cell]]:
    """Rows of the tables: method label -> budget -> cell."""

    def cell(pairs: list[tuple[StudyRun, int]]) -> Cell:
        return Cell(
            [run.best_after(k) / reference for run, k in pairs],
            [run.node_hours(k) for run, k in pairs],
            [run.failed_node_hours(k) for run, k in pairs],
            max(min(k, len(run.values)) for run, k in pairs),
        )

    mine = [(job, run) for job, run in runs if job.profile.key == key]

    def of(method: str) -> list[StudyRun]:
        return [run for job, run in mine if job.method == method]

    def planned(method: str, budget: int) -> list[tuple[StudyRun, int]]:
        return [
            (run, len(run.values)) for job, run in mine if job.method == method and job.n_trials == budget
        ]

    rows: dict[str, dict[int, Cell]] = {}
    for name in dict.fromkeys([DEFAULT_SAMPLER, *extra]):
        label = f"autotune default ({name})" if name == DEFAULT_SAMPLER else f"sampler {name}"
        rows[label] = {b: cell([(run, b) for run in of(name)]) for b in budgets}
    if not of("random"):  # --samplers-only
        return rows
    rows["random search"] = {b: cell([(run, b) for run in of("random")]) for b in budgets}
    rows["random search, 2x the budget"] = {b: cell([(run, 2 * b) for run in of("random")]) for b in budgets}
    rows[f"grid {MEM_FRACTION} x {GRAPH_BS}"] = {b: cell(planned("grid", b)) for b in budgets}
    rows["one group at a time"] = {b: cell(planned("groups", b)) for b in budgets}
    return rows


def print_profile(
    profile: Profile, best: BestKnown, rows: dict[str, dict[int, Cell]], budgets: Sequence[int]
) -> list[str]:
    """Print a profile's tables; returns the Must-show lines (empty when the budgets do not include it)."""
    width = max(len(label) for label in rows) + 2
    print(f"\n== {profile.title}")
    print(
        f"best known: {best.tok_s:.1f} tok/s; the baseline (SGLang's defaults) is {best.baseline:.1f} tok/s"
    )
    print(f"   = {best.baseline / best.tok_s:.3f} of it. Found by: {best.how}")
    print("   " + " ".join(f"{k}={v}" for k, v in best.params.items() if v is not None and v is not False))
    seeds = max(len(row[budgets[0]].ratios) for row in rows.values())
    print(f"\nBest tok/s found / best known: median [min-max] over {seeds} seeds (the grid: one run)")
    print(f"{'method':<{width}}" + "".join(f"{f'budget {b}':>22}" for b in budgets))
    for label, row in rows.items():
        print(f"{label:<{width}}" + "".join(f"{row[b].ratio_text():>22}" for b in budgets))
    print("\nNode hours spent (median over seeds), and the share of them spent on failed trials")
    print(f"{'method':<{width}}" + "".join(f"{f'budget {b}':>22}" for b in budgets))
    for label, row in rows.items():
        print(f"{label:<{width}}" + "".join(f"{row[b].hours_text():>22}" for b in budgets))
    if grid := rows.get(f"grid {MEM_FRACTION} x {GRAPH_BS}"):
        print("(the grid uses " + ", ".join(f"{grid[b].trials} of {b}" for b in budgets) + " trials)")
    return must_show(profile.key, rows, budgets)


def must_show(key: str, rows: dict[str, dict[int, Cell]], budgets: Sequence[int]) -> list[str]:
    """The issue's targets for one profile, at the budgets that were run: the default's median at 40
    trials >= 0.95 of the best known, >= random search with twice the budget (at each budget up to 40),
    and under 5% of its node time on failed trials at 40."""

    def verdict(ok: bool) -> str:
        return "HOLDS" if ok else "DOES NOT HOLD"

    random2 = rows.get("random search, 2x the budget")
    judged = {"autotune": rows[f"autotune default ({DEFAULT_SAMPLER})"]}
    lines = []
    for name, ours in judged.items():
        if MUST_BUDGET in budgets:
            median = statistics.median(ours[MUST_BUDGET].ratios)
            lines.append(
                f"{key}, budget {MUST_BUDGET}: {name}: median best {median:.3f} of the best known "
                f"(must be >= {MUST_WITHIN}): {verdict(median >= MUST_WITHIN)}"
            )
        for budget in (b for b in budgets if b <= MUST_BUDGET and random2 is not None):
            assert random2 is not None  # the loop runs only with it
            a, b = statistics.median(ours[budget].ratios), statistics.median(random2[budget].ratios)
            lines.append(
                f"{key}, budget {budget}: {name}: {a:.3f} vs random search with {2 * budget} trials "
                f"{b:.3f}: {verdict(a >= b)}"
            )
        if MUST_BUDGET in budgets:
            cell = ours[MUST_BUDGET]
            failed = statistics.median(cell.failed_hours) / max(statistics.median(cell.hours), 1e-9)
            lines.append(
                f"{key}, budget {MUST_BUDGET}: {name}: node time on failed trials {failed:.1%} "
                f"(target < {MAX_FAILED:.0%}): {verdict(failed < MAX_FAILED)}"
            )
    return lines


# -- main -----------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profiles",
        default="seed,h200",
        help=f"comma-separated: {', '.join(PROFILES)}, or profile YAML paths (benchmarks/profiles/*.yaml)",
    )
    parser.add_argument("--budgets", default="10,20,40,80", help="comma-separated trial budgets")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--samplers",
        default="",
        help=f"more samplers to compare: {', '.join([*SAMPLERS, *VARIANTS, NO_STAGE])}",
    )
    parser.add_argument(
        "--samplers-only",
        action="store_true",
        help="run autotune's default and --samplers alone: no random search, grid or one group at a time",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="studies run in parallel")
    parser.add_argument("--recompute-best", action="store_true", help="search the best known configs again")
    parser.add_argument("--json", type=Path, help="also write every study's trials to this JSON file")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: seed profile, budgets 4 8, 2 seeds"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.profiles, args.budgets, args.seeds = "seed", "4,8", 2
    budgets = sorted(int(b) for b in args.budgets.split(","))
    extra = [s for s in args.samplers.split(",") if s]
    for name in extra:
        if name not in SAMPLERS and name not in VARIANTS and name != NO_STAGE:
            parser.error(f"unknown sampler {name!r}: samplers {[*SAMPLERS, *VARIANTS, NO_STAGE]}")
    try:
        nodes = [load_profile(p) for p in args.profiles.split(",") if p]
    except ConfigError as exc:
        parser.error(str(exc))
    profiles = [node.key for node in nodes]
    if len(set(profiles)) < len(profiles):
        parser.error(f"two profiles share a name: {profiles} (a YAML profile is named by its file's stem)")
    by_key = dict(zip(profiles, nodes, strict=True))
    if min(budgets) < 2:
        parser.error(f"a budget must leave a trial after the baseline, but got {min(budgets)}")

    started = time.monotonic()
    cache = json.loads(BEST_KNOWN.read_text()) if BEST_KNOWN.exists() else {"profiles": {}}
    context = multiprocessing.get_context("fork")
    with context.Pool(args.jobs) as pool:
        found = pool.starmap(
            find_best_known,
            [(by_key[k], cache["profiles"].get(k), args.recompute_best, args.quick) for k in profiles],
        )
        best = dict(zip(profiles, found, strict=True))
        jobs = plan_jobs(nodes, budgets, args.seeds, extra, best, others=not args.samplers_only)
        jobs.sort(key=lambda job: -job.n_trials)  # the longest first, so the pool ends together
        runs = studies_in_pool(pool, run_job, jobs, started)
        beaten = {key: top for key in profiles if (top := best_trial_of(runs, key))[0] > best[key].tok_s}
        if args.quick:  # the trial itself is the estimate
            how = "the best trial of these studies; a quick estimate (--quick), not cached"
            best.update({k: replace(best[k], tok_s=v, params=p, how=how) for k, (v, p) in beaten.items()})
        else:
            improved = pool.starmap(
                improve_best_known,
                [(by_key[k], best[k], params) for k, (_, params) in beaten.items()],
            )
            best.update(zip(beaten, improved, strict=True))
    if any(b.cache_entry for b in best.values()):
        cache["profiles"].update({k: b.cache_entry for k, b in best.items() if b.cache_entry})
        cache["command"] = RECOMPUTE
        BEST_KNOWN.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n")
    elapsed = time.monotonic() - started

    must: list[str] = []
    for key in profiles:
        rows = cells(runs, key, budgets, best[key].tok_s, extra)
        must += print_profile(by_key[key], best[key], rows, budgets)
    if must:
        print("\nMust show:\n" + "\n".join(must))
    trials = sum(len(run.values) for _, run in runs)
    print(f"\n{len(runs)} studies, {trials} trials, {elapsed:.0f} s on {args.jobs} processes")
    if args.json:
        records = [{**asdict(job), **asdict(run)} for job, run in runs]
        args.json.write_text(
            json.dumps(
                {"best_known": {k: asdict(b) for k, b in best.items()}, "studies": records}, default=str
            )
        )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except AutotuneError as exc:  # a worker's error, sent back by the pool: one line, not a traceback
        print(f"sample_efficiency.py: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
