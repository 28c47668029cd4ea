"""Can a user trust a study's answer, and what does a trustworthy answer cost? (issue 29, point 6)

Whole studies run through the product's study loop on the simulated node's model (model_studies.run_study)
with the run-to-run noise calibrated on the real H200 runs (SGLANG_SIM_NOISE=calibrated; a new lease of the
machine every `LEASE_EVERY` trials, as the real 31-trial study spanned four sessions and two machines), on
the seed and H200 profiles and benchmarks/profiles/*.yaml, over several seeds. For each study:

(a) does its answer claim a gain whose true value (the model without noise) is <= 0;
(b) node hours to a confirmed answer;
(c) the answer's true value against the best known config (best_known.json);
(d) on a flat landscape (a search space of knobs the model ignores: --schedule-policy,
    --schedule-conservativeness, --stream-interval, which the real H200 study found inside the noise), how
    many trials before the study stops, and whether it reports no gain.

"before" is today's behaviour: the answer is the best single measurement and its gain over the baseline's
single measurement (`autotune best`); a confirmed answer costs the study plus a separate `compare` of
`COMPARE_ROUNDS` interleaved rounds on a later lease (as the real H200 run did), which confirms a gain when
its 95% interval excludes zero. "after" is the product's own answer (`confirmed`, `gain_pct`,
`gain_interval_pct`), read through `study_answer`, the one function to point at it.

    nice python benchmarks/trust.py [--quick] [--jobs 2] [--seeds N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import optuna
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import (
    BENCHMARKS,
    PROFILES,
    REPO,
    Landscape,
    NodeClock,
    Profile,
    load_profile,
    run_study,
    studies_in_pool,
)
from sample_efficiency import BEST_KNOWN

from autotune.config import Study
from autotune.sim.model.noise import SimNoise
from autotune.sim.profiles import load_hardware_profile
from autotune.study.rules import best_trial, trial_config

N_TRIALS = 40
LEASE_EVERY = 10  # the real study: 31 trials over four sessions
COMPARE_ROUNDS = 6  # the real H200 run's compare
FLAT_KNOBS = ("--schedule-policy", "--schedule-conservativeness", "--stream-interval")
REAL_SPACE = REPO / "search_spaces" / "sglang-h200.yaml"
# The real single-GPU study's node, model, objective and search space (examples/sglang-h200.yaml), where 17+
# of 27 real configs lay inside one config's run-to-run spread: the case the issue is about.
H200_X1 = Profile(
    "h200-x1",
    "one H200, an 8B Llama: the real H200 study's node, model, objective and search space",
    "h200-x1",
    "llama-8b-dummy",
    REPO / "objectives" / "throughput-h200.yaml",
    "/tmp/model-8b",
    "",
    tp_size=1,
)
Params = dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """A study's answer: the trial it names, the gain it claims over SGLang's defaults, and whether it says
    the gain is confirmed (with its interval)."""

    trial: int
    baseline: bool  # the answer is SGLang's defaults
    gain_pct: float | None
    confirmed: bool
    gain_interval_pct: tuple[float, float] | None
    reports_confirmation: bool  # the product says confirmed or not (today's `best --json` does not)

    @property
    def claims_gain(self) -> bool:
        if self.baseline or self.gain_pct is None or self.gain_pct <= 0:
            return False
        low = self.gain_interval_pct[0] if self.gain_interval_pct is not None else None
        return low is None or low > 0


def study_answer(study: Study, ostudy: optuna.Study) -> Answer:
    """The study's answer as `autotune best --json` reports it (cli._best_record over study_summary): the one
    place to point at the product's new answer (`confirmed`, `gain_interval_pct`) once it reports one."""
    from autotune.cli import _best_record
    from autotune.study.loop import study_summary

    best = best_trial(ostudy)
    assert best is not None, f"study {study.name} has no completed trial"
    config = trial_config(study, best)
    record = _best_record(study, study_summary(ostudy), best, config, study.server_launch(config))
    interval = record.get("gain_interval_pct")
    return Answer(
        trial=record["trial"],
        baseline=record["baseline"],
        gain_pct=record["gain_pct"],
        confirmed=bool(record.get("confirmed", False)),
        gain_interval_pct=(interval[0], interval[1]) if interval else None,
        reports_confirmation="confirmed" in record,
    )


@dataclass(frozen=True)
class Job:
    profile: Profile
    seed: int
    n_trials: int
    flat: bool
    compare_rounds: int


@dataclass(frozen=True)
class Outcome:
    """One study's answer, what it is truly worth, and what it cost."""

    job: Job
    trials: int  # trials that used the budget before the study ended
    claimed_gain_pct: float  # the answer's gain (0 when it names the defaults or claims none)
    true_gain_pct: float  # the answer's config over the defaults, both without noise
    claims_gain: bool
    true_value: float  # tok/s without noise
    study_h: float
    compare_claims_gain: bool  # before: the separate compare's interval excludes zero, above it
    compare_gain_pct: float
    compare_h: float
    after_confirmed: bool  # the product's own answer says confirmed
    after_reported: bool  # the product's answer says whether it is confirmed: the "after" columns

    @property
    def after_claims_gain(self) -> bool:
        """The product's own answer claims a confirmed gain."""
        return self.after_confirmed and self.claims_gain


_LANDSCAPES: dict[str, Landscape] = {}


def landscape(profile: Profile) -> Landscape:
    """The noise-free landscape of `profile`, one per process (its launches cached)."""
    if profile.key not in _LANDSCAPES:
        _LANDSCAPES[profile.key] = Landscape(profile, Path(tempfile.mkdtemp(prefix="autotune-trust-")))
    return _LANDSCAPES[profile.key]


def search_space(profile: Profile, flat: bool) -> dict[str, Any] | None:
    """The study's search space: the knobs the model ignores (and the real H200 study found inside the
    noise) for a flat landscape; the real study's for its profile; else the shipped one (None)."""
    real = yaml.safe_load(REAL_SPACE.read_text())
    if flat:
        return {**real, "parameters": {k: real["parameters"][k] for k in FLAT_KNOBS}}
    return real if profile.key == H200_X1.key else None


def run_job(job: Job) -> Outcome:
    profile = job.profile
    truth = landscape(profile)
    base_true = truth.value_of(truth.space.baseline())

    def inspect(study: Study, ostudy: optuna.Study, clock: NodeClock) -> Outcome:
        from autotune.views.compare import compare

        answer = study_answer(study, ostudy)
        chosen = next(t for t in ostudy.get_trials(deepcopy=False) if t.number == answer.trial)
        true_value = truth.value_of(trial_config(study, chosen))
        study_s = clock.total_s
        # The separate compare, as the real run's: on the next lease, with draws of its own.
        clock.lease, clock.lease_every = 1 + job.n_trials // LEASE_EVERY, 0
        clock.noise_seed += 5000
        gain = None
        if not answer.baseline:
            # compare types its executor as a TrialExecutor; the model node answers the same run(request).
            node = cast(Any, clock)
            gain = compare(study, ostudy, job.compare_rounds, trial=answer.trial, executor=node).gain()
        return Outcome(
            job=job,
            trials=sum(1 for t in ostudy.get_trials(deepcopy=False) if t.state.is_finished()),
            claimed_gain_pct=answer.gain_pct if answer.claims_gain and answer.gain_pct is not None else 0.0,
            true_gain_pct=(true_value / base_true - 1) * 100 if base_true else 0.0,
            claims_gain=answer.claims_gain,
            true_value=true_value,
            study_h=study_s / 3600,
            compare_claims_gain=gain is not None and gain.verdict == "gain",
            compare_gain_pct=gain.percent.mean if gain is not None else 0.0,
            compare_h=(clock.total_s - study_s) / 3600,
            after_confirmed=answer.confirmed,
            after_reported=answer.reports_confirmation,
        )

    noise = SimNoise.calibrated(load_hardware_profile(profile.hardware).noise)
    run = run_study(
        profile,
        job.n_trials,
        seed=job.seed,
        noise=noise,
        lease_every=LEASE_EVERY,
        search_space=search_space(profile, job.flat),
        nccl_stage=not job.flat and profile.tp > 1,  # one GPU has no all-reduces to tune
        inspect=inspect,
    )
    outcome: Outcome = run.inspected
    return outcome


def profiles(quick: bool) -> list[Profile]:
    if quick:
        return [PROFILES["h200"]]
    files = sorted((BENCHMARKS / "profiles").glob("*.yaml"))
    return [H200_X1, PROFILES["seed"], PROFILES["h200"], *(load_profile(str(path)) for path in files)]


def pct(count: int, total: int) -> str:
    return f"{count}/{total} ({count / total:.0%})" if total else "-"


def table(outcomes: Sequence[Outcome], best_known: dict[str, float]) -> list[str]:
    # "after": the product's own answer, once it says whether it is confirmed (its confirmation rounds are
    # part of the study, so its node hours are the study's).
    after = any(o.after_reported for o in outcomes)
    lines = [
        "| profile | seeds | (a) answer claims a gain, true gain <= 0: before (study alone) | before, "
        "confirmed by compare | (b) median node h to a confirmed answer, before (study + compare) "
        "| (c) true value / best known, median (min) | answer's claimed gain, mean | its true gain, mean |"
        + (" (a) after: confirmed gain, true gain <= 0 | (b) after: median node h |" if after else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if after else ""),
    ]
    by_profile: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.job.flat:
            by_profile.setdefault(o.job.profile.key, []).append(o)
    for key, rows in by_profile.items():
        false_claims = sum(o.claims_gain and o.true_gain_pct <= 0 for o in rows)
        false_confirmed = sum(o.compare_claims_gain and o.true_gain_pct <= 0 for o in rows)
        ratios = [o.true_value / best_known[key] for o in rows] if key in best_known else []
        ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"
        lines.append(
            f"| {key} | {len(rows)} | {pct(false_claims, len(rows))} | {pct(false_confirmed, len(rows))} | "
            f"{statistics.median(o.study_h + o.compare_h for o in rows):.2f} | {ratio} | "
            f"{statistics.mean(o.claimed_gain_pct for o in rows):+.2f}% | "
            f"{statistics.mean(o.true_gain_pct for o in rows):+.2f}% |"
            + (
                f" {pct(sum(o.after_claims_gain and o.true_gain_pct <= 0 for o in rows), len(rows))} | "
                f"{statistics.median(o.study_h for o in rows):.2f} |"
                if after
                else ""
            )
        )
    flat = [o for o in outcomes if o.job.flat]
    if flat:
        lines += [
            "",
            "(d) Flat landscape (" + ", ".join(f"`{k}`" for k in FLAT_KNOBS) + ": knobs the model ignores)",
            "",
            "| profile | seeds | trials before the study stops | reports no gain: before (study alone) "
            "| before, compare | claimed gain, mean | node h, study + compare, median |"
            + (" reports no gain: after |" if after else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if after else ""),
        ]
        for key in dict.fromkeys(o.job.profile.key for o in flat):
            rows = [o for o in flat if o.job.profile.key == key]
            lines.append(
                f"| {key} | {len(rows)} | {statistics.median(o.trials for o in rows):.0f} | "
                f"{pct(sum(not o.claims_gain for o in rows), len(rows))} | "
                f"{pct(sum(not o.compare_claims_gain for o in rows), len(rows))} | "
                f"{statistics.mean(o.claimed_gain_pct for o in rows):+.2f}% | "
                f"{statistics.median(o.study_h + o.compare_h for o in rows):.2f} |"
                + (f" {pct(sum(not o.after_claims_gain for o in rows), len(rows))} |" if after else "")
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one profile, one seed, 6 trials")
    parser.add_argument("--seeds", type=int, default=10, help="studies per profile (default 10)")
    parser.add_argument("--jobs", type=int, default=2, help="studies run in parallel (default 2)")
    parser.add_argument("--profile", action="append", help="only these profiles (by key; repeatable)")
    args = parser.parse_args(argv)
    seeds = 1 if args.quick else args.seeds
    n_trials = 6 if args.quick else N_TRIALS
    rounds = 2 if args.quick else COMPARE_ROUNDS
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    chosen = [p for p in profiles(args.quick) if not args.profile or p.key in args.profile]
    jobs = [Job(p, s, n_trials, flat, rounds) for p in chosen for s in range(seeds) for flat in (False, True)]
    if args.quick:
        jobs = [job for job in jobs if job.profile.key == "h200"][:2]
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    best_known = {key: entry["tok_s"] for key, entry in cached.items()}
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        outcomes = studies_in_pool(pool, run_job, jobs, started)
    order = {p.key: i for i, p in enumerate(chosen)}
    outcomes.sort(key=lambda o: (o.job.flat, order[o.job.profile.key], o.job.seed))
    print(
        f"## Trust, before: {n_trials}-trial TPE studies with calibrated noise (a new lease every "
        f"{LEASE_EVERY} trials), {seeds} seeds, compare of {rounds} rounds\n"
    )
    print("\n".join(table(outcomes, best_known)))
    print(f"\n{len(outcomes)} studies in {time.monotonic() - started:.0f} s on {args.jobs} processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
