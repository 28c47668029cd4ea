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
`gain_interval_pct`: study.confirm.study_answer) with the study file's trust defaults: the baseline
repeated early, no launch made twice, the stopping rule, the winner confirmed in interleaved rounds; its
node hours include every one of those launches. Both run on the same seeds.

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
from autotune.study.compare import compare
from autotune.study.confirm import study_answer as product_answer
from autotune.study.records import BASELINE_ATTR, NODE_ATTR, REMEASURE_OF_ATTR
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
    """A study's answer: the trial it names, the gain it claims over SGLang's defaults, and whether that
    gain is confirmed."""

    trial: int
    gain_pct: float | None
    claims_gain: bool  # it names a config other than the defaults as better
    confirmed: bool  # the product's own answer says it measured the gain in interleaved rounds


def single_measurement_answer(ostudy: optuna.Study) -> Answer:
    """Before: the best single measurement and its gain over the baseline's single measurement, as
    `autotune best` answered before the study confirmed anything."""
    best = best_trial(ostudy)
    assert best is not None and best.value is not None, "the study has no completed trial"
    base = next(t for t in ostudy.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR))
    gain = (best.value / base.value - 1) * 100 if base.value else None
    is_base = bool(best.user_attrs.get(BASELINE_ATTR))
    return Answer(best.number, gain, not is_base and gain is not None and gain > 0, False)


def study_answer(ostudy: optuna.Study) -> Answer:
    """After: the product's own answer, what `autotune best --json` reports (study.confirm.study_answer)."""
    record = product_answer(ostudy)
    assert record is not None, "the study has no answer"
    gain = record["gain_pct"]
    if record["confirmed"]:
        claims = bool(record["beats_defaults"])
    else:  # an unconfirmed answer still names a config and a gain
        claims = gain is not None and gain > 0 and not record.get("within_noise")
    return Answer(record["trial"], gain, claims, bool(record["confirmed"]))


@dataclass(frozen=True)
class Job:
    profile: Profile
    seed: int
    n_trials: int
    flat: bool
    compare_rounds: int
    trust: bool  # after: the product's trust defaults; before: `trust: off` and a separate compare


@dataclass(frozen=True)
class Outcome:
    """One study's answer, what it is truly worth, and what it cost."""

    job: Job
    trials: int  # search launches before the study ended (the baseline's first included)
    launches: int  # every launch, confirmation and baseline repeats included
    claims_gain: bool  # the answer (before: of the study alone) names a config better than the defaults
    confirmed_claims_gain: bool  # before: the separate compare's interval lies above zero; after: the answer
    claimed_gain_pct: float  # the answer's gain (0 when it names the defaults or claims none)
    true_gain_pct: float  # the answer's config over the defaults, both without noise
    true_value: float  # tok/s without noise
    node_h: float  # to a confirmed answer: the study (and, before, its compare)


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
        answer = study_answer(ostudy) if job.trust else single_measurement_answer(ostudy)
        chosen = next(t for t in ostudy.get_trials(deepcopy=False) if t.number == answer.trial)
        true_value = truth.value_of(trial_config(study, chosen))
        confirmed_claims = answer.confirmed and answer.claims_gain
        if not job.trust and answer.claims_gain:
            # The separate compare, as the real run's: on the next lease, with draws of its own.
            clock.lease, clock.lease_every = 1 + job.n_trials // LEASE_EVERY, 0
            clock.noise_seed += 5000
            # compare types its executor as a TrialExecutor; the model node answers the same run(request).
            node = cast(Any, clock)
            gain = compare(study, ostudy, job.compare_rounds, trial=answer.trial, executor=node).gain()
            confirmed_claims = gain is not None and gain.verdict == "gain"
        launched = [t for t in ostudy.get_trials(deepcopy=False) if NODE_ATTR in t.user_attrs]
        return Outcome(
            job=job,
            trials=sum(1 for t in launched if REMEASURE_OF_ATTR not in t.user_attrs),
            launches=len(launched),
            claims_gain=answer.claims_gain,
            confirmed_claims_gain=confirmed_claims,
            claimed_gain_pct=answer.gain_pct if answer.claims_gain and answer.gain_pct is not None else 0.0,
            true_gain_pct=(true_value / base_true - 1) * 100 if base_true else 0.0,
            true_value=true_value,
            node_h=clock.total_s / 3600,
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
        trust=job.trust,
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
    """Before and after side by side, the same seeds: per profile, then the flat landscape."""

    def split(rows: list[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
        return [o for o in rows if not o.job.trust], [o for o in rows if o.job.trust]

    def false_gains(rows: list[Outcome], confirmed: bool) -> str:
        claims = [(o.confirmed_claims_gain if confirmed else o.claims_gain) for o in rows]
        return pct(sum(c and o.true_gain_pct <= 0 for c, o in zip(claims, rows, strict=True)), len(rows))

    def hours(rows: list[Outcome]) -> str:
        return f"{statistics.median(o.node_h for o in rows):.2f}" if rows else "-"

    def worth(rows: list[Outcome], key: str) -> str:
        ratios = [o.true_value / best_known[key] for o in rows] if key in best_known else []
        return f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"

    lines = [
        "| profile | seeds | (a) claims a gain whose true value <= 0: before, study alone | before, after "
        "compare | after | (b) median node h to a confirmed answer: before (study + compare) | after "
        "| (c) true value / best known, median (min): before | after | launches, median: before | after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_profile: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.job.flat:
            by_profile.setdefault(o.job.profile.key, []).append(o)
    for key, rows in by_profile.items():
        before, after = split(rows)
        lines.append(
            f"| {key} | {len(before)} | {false_gains(before, False)} | {false_gains(before, True)} | "
            f"{false_gains(after, True)} | {hours(before)} | {hours(after)} | {worth(before, key)} | "
            f"{worth(after, key)} | {statistics.median(o.launches for o in before):.0f} | "
            f"{statistics.median(o.launches for o in after) if after else 0:.0f} |"
        )
    flat = [o for o in outcomes if o.job.flat]
    if flat:
        lines += [
            "",
            "(d) Flat landscape (" + ", ".join(f"`{k}`" for k in FLAT_KNOBS) + ": knobs the model ignores)",
            "",
            "| profile | seeds | trials before the study stops: before | after | reports no gain: before, "
            "study alone | before, after compare | after | median node h: before (study + compare) | after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in dict.fromkeys(o.job.profile.key for o in flat):
            before, after = split([o for o in flat if o.job.profile.key == key])
            lines.append(
                f"| {key} | {len(before)} | {statistics.median(o.trials for o in before):.0f} | "
                f"{statistics.median(o.trials for o in after) if after else 0:.0f} | "
                f"{pct(sum(not o.claims_gain for o in before), len(before))} | "
                f"{pct(sum(not o.confirmed_claims_gain for o in before), len(before))} | "
                f"{pct(sum(not o.confirmed_claims_gain for o in after), len(after))} | "
                f"{hours(before)} | {hours(after)} |"
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
    jobs = [
        Job(p, s, n_trials, flat, rounds, trust)
        for p in chosen
        for s in range(seeds)
        for flat in (False, True)
        for trust in (False, True)
    ]
    if args.quick:
        jobs = [job for job in jobs if job.profile.key == "h200"][:4]
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    best_known = {key: entry["tok_s"] for key, entry in cached.items()}
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        outcomes = studies_in_pool(pool, run_job, jobs, started)
    order = {p.key: i for i, p in enumerate(chosen)}
    outcomes.sort(key=lambda o: (o.job.flat, order[o.job.profile.key], o.job.seed))
    print(
        f"## Trust, before and after: {n_trials}-trial TPE studies with calibrated noise (a new lease every "
        f"{LEASE_EVERY} trials), {seeds} seeds; before: `trust: off` and a compare of {rounds} rounds; "
        "after: the trust defaults\n"
    )
    print("\n".join(table(outcomes, best_known)))
    print(f"\n{len(outcomes)} studies in {time.monotonic() - started:.0f} s on {args.jobs} processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
