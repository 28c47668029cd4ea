"""`autotune run`, `resume`, `remeasure`, `ablate`, `compare` and `enqueue`: the commands that change a
study, by running trials, launching servers or queueing configs; they share the driver and its options.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autotune.cli.answers import summary_text
from autotune.cli.common import EXIT_NO_ANSWER, existing_study
from autotune.cli.console import ConsoleReporter
from autotune.config import Study, load_study
from autotune.errors import ConfigError
from autotune.trial.launch import to_arg

if TYPE_CHECKING:  # the driver loads Optuna, Ray and MLflow: only the commands that run trials import it
    from autotune.study.loop import StudyDriver


def cmd_run(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file)
    if args.n_trials is not None and args.n_trials < 1:
        raise ConfigError(
            args.study_file,
            "--n-trials",
            args.n_trials,
            "the budget must be positive",
            "Pass --n-trials 1 or more.",
        )
    study = with_hours(study, args)
    print(f"autotune: study {study.name!r}: storage {study.storage}", file=sys.stderr)
    print(f"autotune: MLflow tracking {study.tracking_uri}", file=sys.stderr)
    if getattr(args, "from_study", None) is not None:
        _start_from(study, args)
    hours_from = "--hours" if getattr(args, "hours", None) is not None else "budget.node_hours"
    driver = _driver(study, args, hours_from=hours_from)
    optuna_study = driver.run(args.n_trials, accept_changes=args.accept_changes)
    optuna_study = _remeasure(study, optuna_study, args)
    print(summary_text(study_summary(optuna_study), study))
    from autotune.study.trust.node_budget import node_hours

    print(node_hours(study, optuna_study).text())  # in the node's own clock (docs/study-file.md, "budget")
    from autotune.study.enqueue import waiting_line

    if waiting := waiting_line(optuna_study, args.n_trials or study.file.budget.n_trials, args.study_file):
        print(waiting)  # configs queued by hand that the spent budget left waiting
    from autotune.study.node_failing import baseline_missing

    if (missing := baseline_missing(optuna_study, args.study_file)) is not None:
        print(f"autotune: {missing}", file=sys.stderr)
        return EXIT_NO_ANSWER
    print(next_commands(args.study_file))
    return 0


def _start_from(study: Study, args: argparse.Namespace) -> None:
    """`run --from OLD.yaml`: the earlier study checked, then its configs queued first (study.warm_start)."""
    from autotune.study.warm_start import read_earlier, start_from

    earlier = read_earlier(args.from_study, study)  # every check before anything is written
    numbers = start_from(study, earlier, accept_changes=args.accept_changes)
    for number, (role, old_trial, _) in zip(numbers, earlier.configs, strict=False):
        print(
            f"autotune: trial {number} launches the earlier study {earlier.name!r}'s {role} (its trial "
            f"{old_trial})",
            file=sys.stderr,
        )
    if numbers and earlier.noise is not None:
        print(
            f"autotune: its noise ({earlier.noise['relative_sd']:.2%} of a measurement) stands in until this "
            "study measured its own",
            file=sys.stderr,
        )


def with_hours(study: Study, args: argparse.Namespace) -> Study:
    """The study with `--hours` as its node-hour budget (a bad value refused before anything starts)."""
    hours = getattr(args, "hours", None)
    if hours is None:
        return study
    if not (math.isfinite(hours) and hours > 0):
        raise ConfigError(
            args.study_file,
            "--hours",
            hours,
            "a node-hour budget must be a positive number of hours",
            "Pass e.g. --hours 2 (the study's total, the hours it spent included).",
        )
    budget = study.file.budget.model_copy(update={"node_hours": hours})
    return replace(study, file=study.file.model_copy(update={"budget": budget}))


def next_commands(study_file: Any) -> str:
    """What to run next on the study, with its file's path."""
    path = str(study_file)
    rows = [
        (f"autotune status {path}", "every trial: state, value, what it changed, why it failed"),
        (f"autotune report {path} --out report/", "one HTML page: summary, plots, failures"),
        (f"autotune ui {path}", "the MLflow UI on the study's runs"),
        (f"autotune best {path} --export best.sh", "the answer as a launch script"),
    ]
    width = max(len(command) for command, _ in rows)
    return "\n".join(["next:", *(f"  {command:<{width}}  # {what}" for command, what in rows)])


def _driver(study: Study, args: argparse.Namespace, **options: Any) -> StudyDriver:
    """The driver for every phase a command runs (trials, re-measurement, ablation), with its options
    (`options`: StudyDriver's keywords a command adds)."""
    from autotune.node.pool import RayNodePool, in_process_pool
    from autotune.study.loop import StudyDriver
    from autotune.tracking.store import check_store
    from autotune.views.tracked import study_tracker

    if not args.no_tracking:  # in seconds, before Ray starts: MLflow's own retries take minutes
        check_store(study.tracking_uri, study.path)
    return StudyDriver(
        study,
        [ConsoleReporter()],
        pool=in_process_pool if args.no_ray else RayNodePool,
        tracking=None if args.no_tracking else study_tracker,
        **options,
    )


def _remeasure(study: Study, optuna_study: Any, args: argparse.Namespace) -> Any:
    """Run the re-measurements the objective asks for (none without `remeasure`, none left to run)."""
    from autotune.study.remeasure import remeasure

    settings = study.objective.remeasure
    if settings is None:
        return optuna_study

    def run(total: int) -> Any:
        print(
            f"autotune: re-measuring the top {settings.top} configs and the baseline until each has "
            f"{settings.repeats} measurements",
            file=sys.stderr,
        )
        return _driver(study, args).run(total)

    return remeasure(study, optuna_study, run)


def cmd_remeasure(args: argparse.Namespace) -> int:
    from autotune.study.summary import study_summary

    study = load_study(args.study_file)
    if study.objective.remeasure is None:
        raise ConfigError(
            study.objective_path,
            "remeasure",
            None,
            "the objective does not ask for re-measurement",
            "Add e.g. `remeasure: {top: 3, repeats: 3}` to the objective file (then resume with "
            "--accept-changes).",
        )
    optuna_study = _remeasure(study, existing_study(study), args)
    print(summary_text(study_summary(optuna_study), study))
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from optuna.trial import TrialState

    from autotune.study.ablation import ablation_results, enqueue_ablation, plan_ablation
    from autotune.study.enqueue import BASELINE_CHOICE
    from autotune.study.storage import budget_used

    study = load_study(args.study_file, for_launch=not args.dry_run)
    optuna_study = existing_study(study)
    plan = plan_ablation(optuna_study)
    print(f"ablation of trial {plan.of}: revert one setting at a time to the baseline's value")
    for name, value in plan.reverts.items():
        done = " (already run)" if name in plan.done else ""
        chosen = f" ({BASELINE_CHOICE})" if name in plan.server_chosen else ""
        print(f"  {name} -> {'default' if value is None else to_arg(value)}{chosen}{done}")
    for name, why in plan.not_ablated.items():
        print(f"  {name}: not reverted alone: {why}")
    if args.dry_run:
        return 0
    queued = enqueue_ablation(optuna_study, plan)
    waiting = len(optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if waiting:
        print(
            f"autotune: running {waiting} queued trial(s) ({len(queued)} new ablation trial(s))",
            file=sys.stderr,
        )
        # its tracker marks ablation runs
        optuna_study = _driver(study, args).run(budget_used(optuna_study) + waiting)
    result = ablation_results(optuna_study)
    if result is not None:
        metric = study.objective.metric
        print(f"trial {result.of}: {metric} {result.best_value:.2f}; without each setting:")
        for row in result.rows:
            if row.loss is None:
                print(f"  {row.param:<36} {row.state.lower()} ({row.failure_kind}): needed to run")
            else:
                share = f", {row.share_of_gain:.0%} of the gain" if row.share_of_gain is not None else ""
                print(f"  {row.param:<36} {row.value:.2f} ({-(row.loss_pct or 0.0):+.1f}%{share})")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    from autotune.study import enqueue
    from autotune.study.storage import open_study

    study = load_study(args.study_file, for_launch=False)
    space = study.search_space
    if args.file is not None and (args.settings or args.from_trial is not None):
        raise ConfigError(
            args.file,
            "",
            str(args.file),
            "--file holds whole configs: --set and --from-trial do not add to them",
            "Write those knobs (and `from_trial: N`) in the file's configs, or queue them separately.",
        )
    if args.file is not None:
        requests = enqueue.requests_from_file(args.file, space)
    elif args.settings or args.from_trial is not None:
        requests = [enqueue.request_from_cli(args.settings, args.from_trial, space, args.study_file)]
    else:
        raise ConfigError(
            args.study_file,
            "--set",
            None,
            "no config to queue",
            "Pass --set NAME=VALUE (repeatable), --from-trial N, or --file CONFIGS.yaml.",
        )
    stored = enqueue.stored_study(study)
    queued = enqueue.plan_all(study, requests, stored)  # every config checked before any is queued
    # A new study is created as `autotune run` creates it: its baseline is queued first.
    optuna_study = open_study(study, accept_changes=args.accept_changes)
    numbers = enqueue.enqueue(optuna_study, queued)
    if stored is None:
        print(f"created study {study.name!r} in {study.storage}; its baseline runs first")
    for number, entry in zip(numbers, queued, strict=True):
        settings = " ".join(f"{k}={to_arg(v)}" for k, v in entry.request.settings.items()) or "nothing set"
        rest = (
            f"the rest from trial {entry.request.from_trial}"
            if entry.request.from_trial is not None
            else "the rest at the baseline's values"
        )
        print(f"queued trial {number}: {settings}; {rest}")
        for name, value in entry.server_chosen.items():
            print(f"  {name} = {to_arg(value)}  ({enqueue.BASELINE_CHOICE})")
    print(enqueue.waiting_line(optuna_study, study.file.budget.n_trials, args.study_file))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune.study.compare import compare, describe_run, write

    study = load_study(args.study_file)
    if args.rounds < 2:
        raise ConfigError(
            args.study_file,
            "--rounds",
            args.rounds,
            "an interval needs two rounds",
            "Pass --rounds 2 or more.",
        )
    optuna_study = existing_study(study)
    metric = study.objective.metric

    if args.ray:
        print("autotune: compare --ray is the default now and will go: leave it out", file=sys.stderr)

    def run(total: int) -> Any:
        return _driver(study, args, queued_only=True).run(total)  # its rounds, nothing the sampler proposes

    comparison = compare(
        study,
        optuna_study,
        args.rounds,
        trial=args.trial,
        on_run=lambda run: print(describe_run(run, metric), file=sys.stderr, flush=True),
        run=run,
    )
    path = write(comparison, args.out or study.workdir / "compare.json")
    if args.json:
        print(comparison.to_json())
        return 0
    settings = [f"{k}={v}" for k, v in comparison.best_env.items()]
    settings += [flag if v is None else f"{flag} {v}" for flag, v in comparison.best_flags.items()]
    print(f"best: trial {comparison.best_trial}: {' '.join(settings) or 'nothing set (the default)'}")
    print(comparison.table())
    print(f"runs and summary written to {path}")
    return 0
