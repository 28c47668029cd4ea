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
`gain_interval_pct`: study.answer.study_answer) with the study file's trust defaults: the baseline
repeated early, no launch made twice, the stopping rule, the winner confirmed in interleaved rounds; its
node hours include every one of those launches. Both run on the same seeds.

`--variants` measures other trust sections side by side on the same seeds (VARIANTS: screening's two
methods, `noise_ties`), with the search launches spent on knobs without effect; `per-look` is the trust
defaults under the confirmation rule before issue 41 (each look's interval at the confidence split over the
candidates only, not over the rounds it is looked at); `confirm-41` the confirmation as issue 41 left it,
before issue 37 item 4 (every candidate confirmed, no search launch counted as a round, the rounds' width
judged at the looks' confidence); `no-nccl-stage` the defaults without the NCCL stage; `no-pool-noise` the
confirmation's rounds judged by their own spread alone (before issue 37 item 4's second round), `pool-noise-1`
the defaults with one round deciding on the study's noise (`min_rounds: 1`); `one-knob` the default sampler
with every move from the best changing one knob (SAMPLER_SETTINGS: the sampler's settings, not the trust
section's); `half-hours` the defaults under a node-hour budget of half what "after" spends on each profile
(HALF_HOURS): false gains, "no gain" on flat landscapes and the answers' worth where a budget binds.

A last table splits the node hours of the studies where gains exist by part (PARTS: the NCCL stage, the
baseline and its repeats, the search, its failed launches, the confirmation), with what the NCCL values the
answer sets add to its true tok/s, and what the search spent waiting (issue 37 items 2/7: node hours until
a launch within the noise band of the answer's true value, the search launches after it and their node
hours; `--per-study` prints them per study). `no-stop` is a search no rule stops; `--dump DIR` writes each
study's trials for benchmarks/stop_replay.py, which replays other stopping rules on them.

`--objective max_load` runs the same on benchmarks/peers/run.py's max_load profiles and objective (the
highest request rate within the cookbook's SLO, its true value the finer noise-free load search there; no
best known config: column (c) is left out). A gain over defaults that met the SLO at no rate is a true gain
wherever the answer meets it.

    nice python benchmarks/trust.py [--quick] [--jobs 2] [--seeds N] [--variants before,after,no-screen]
    nice python benchmarks/trust.py --objective max_load [--seeds N] [--variants after]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import (
    BENCHMARKS,
    PROFILES,
    REPO,
    Landscape,
    NodeClock,
    Profile,
    load_profile,
    parameter_values,
    run_study,
    studies_in_pool,
)
from sample_efficiency import BEST_KNOWN

from autotune.config import Study, load_objective
from autotune.measure.plan import plan_for
from autotune.sim.model.noise import SimNoise
from autotune.sim.profiles import load_hardware_profile
from autotune.study.compare import compare
from autotune.study.records import (
    BASELINE_ATTR,
    COMPARE_ATTR,
    CONFIRM_ATTR,
    NODE_ATTR,
    REMEASURE_OF_ATTR,
)
from autotune.study.rules import best_trial, is_feasible, trial_config
from autotune.study.trust import confirm as confirm_rule
from autotune.study.trust.answer import study_answer as product_answer
from autotune.study.trust.noise import noise_estimate

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


def single_measurement_answer(optuna_study: optuna.Study) -> Answer:
    """Before: the best single measurement and its gain over the baseline's single measurement, as
    `autotune best` answered before the study confirmed anything."""
    best = best_trial(optuna_study)
    assert best is not None and best.value is not None, "the study has no completed trial"
    base = next(t for t in optuna_study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR))
    gain = (best.value / base.value - 1) * 100 if base.value else None
    is_base = bool(best.user_attrs.get(BASELINE_ATTR))
    return Answer(best.number, gain, not is_base and gain is not None and gain > 0, False)


def study_answer(optuna_study: optuna.Study) -> Answer:
    """After: the product's own answer, what `autotune best --json` reports (study.answer.study_answer)."""
    answer = product_answer(optuna_study)
    assert answer is not None, "the study has no answer"
    gain = answer.gain_pct
    if answer.confirmed:
        claims = bool(answer.beats_defaults)
    else:  # an unconfirmed answer still names a config and a gain
        claims = gain is not None and gain > 0 and not answer.within_noise
    return Answer(answer.trial, gain, claims, answer.confirmed)


# The study file's `trust` section of each variant measured side by side: "before" is `trust: off` with a
# separate compare; "after" the product's defaults; the others change one part of the defaults.
VARIANTS: dict[str, bool | dict[str, Any]] = {
    "before": False,
    "after": True,
    "no-screen": {"screen": False},
    "screen-moves": {"screen": {"method": "moves"}},
    "screen-alone": {"screen": {"method": "alone"}},
    "noise-ties": {"noise_ties": True},
    "no-noise-ties": {"noise_ties": False},
    "per-look": True,  # the defaults, under the confirmation rule before issue 41 (per_look_confidence)
    # The stopping rule in node hours (issue 37 item 2), sized on the seed's node (a launch ~0.2 node h, its
    # answer first launched at 2.8-4.7 h): after 2.5 node h, stop when the last 2 node h gained no more
    # than the noise; alone (the rule in trials out of reach), or beside (20, 15), whichever is met first.
    "stop-hours": {
        "stop_early": {"min_node_hours": 2.5, "patience_node_hours": 2.0, "min_trials": 999, "patience": 999}
    },
    "stop-hours-or-trials": {"stop_early": {"min_node_hours": 2.5, "patience_node_hours": 2.0}},
    "stop-trials": {"stop_early": {"patience_node_hours": None}},  # (20, 15) alone, as before issue 37
    "no-nccl-stage": True,  # the defaults without the NCCL stage (NO_STAGE): what the stage buys, per profile
    # The confirmation as issue 41 left it (issue 37 item 4's "before"): the runner-up always confirmed, and
    # the rounds' width judged at the confidence spent over the looks too (OLD_CONFIRMATION).
    "confirm-41": {"confirm": {"pair_search_launches": False}},
    "keep-runner-up": True,  # the defaults, the runner-up confirmed even beyond noise of the leader
    # The defaults, no launch of the search counted as a confirmation round.
    "no-search-rounds": {"confirm": {"pair_search_launches": False}},
    # The leader's interval pooled with the study's noise estimate (issue 37 item 4, second round), from
    # `min_rounds` (2) or from one round of the confirmation's own.
    "pool-noise": {"confirm": {"pool_noise": True}},  # the defaults since it was measured
    "no-pool-noise": {"confirm": {"pool_noise": False}},  # the confirmation's own spread alone, as before
    "pool-noise-1": {"confirm": {"pool_noise": True, "min_rounds": 1}},
    "no-stop": {"stop_early": {"min_trials": 999, "patience": 999, "patience_node_hours": None}},
    # The patience that grows with the search (study.trust.stopping, `min_patience`): 0.75 of the search
    # trials to the best's last raise, between 8 and 15 (the default since session 12); `fixed-patience`:
    # 15 always, the default before.
    "grows-from-8": {"stop_early": {"min_patience": 8}},
    "fixed-patience": {"stop_early": {"min_patience": None}},
    "one-knob": True,  # the defaults, every move from the best changing one knob (SAMPLER_SETTINGS)
    "start-6": True,  # the defaults, a start of 6 trials instead of 10 (SAMPLER_SETTINGS)
    "half-hours": True,  # the defaults under half the node hours "after" spends (HALF_HOURS)
}
# Variants that change the default sampler's settings (autotune.study.samplers.tpe), not the trust section.
# Issue 37 items 2/7 measured these too, and took them out again (they lived at `0ecfc8f`): the knobs whose
# every move lost more than 2% last in the moves' sweep (`sweep-evidence`), and never a two-knob move's
# second knob either (`moves-evidence`).
SAMPLER_SETTINGS: dict[str, dict[str, Any]] = {
    "one-knob": {"second": 0.0},  # the default: a move changes two knobs with probability 0.3
    "start-6": {"n_startup_trials": 6},  # the default start is 10 trials
}
DUMP: list[Path] = []  # --dump: the folder each study's trials are written to
NO_STAGE = ("no-nccl-stage",)
# "half-hours": a node-hour budget of half the median node hours the defaults spent on each profile, with
# gains and on the flat landscape (`--variants after` at 1d918e5, 20 seeds): the false gains, the flat
# landscape's "no gain" and the answers' worth where the budget binds (study.trust.node_budget).
HALF_HOURS: dict[tuple[str, bool], float] = {
    (key, flat): round(hours / 2, 2)
    for key, with_gains, flat_h in (
        ("h200-x1", 0.26, 0.17),
        ("seed", 1.74, 1.44),
        ("h200", 0.94, 0.48),
        ("h100x4-llama70b", 1.17, 0.55),
        ("h100x8-qwen3coder480b", 1.19, 0.61),
        ("heldout-l40sx4-qwen32b", 1.15, 0.71),
    )
    for flat, hours in ((False, with_gains), (True, flat_h))
}


def per_look_confidence(settings: dict[str, Any], candidates: int) -> float:
    """The confirmation rule before issue 41: each look at the study's confidence split over the candidates
    only, so a test looked at after every round spent its error once per look."""
    return 1 - (1 - float(settings.get("confidence", 0.95))) / max(candidates, 1)


def every_candidate(
    top: Sequence[Any], noise: Any, maximize: bool, confidence: float
) -> tuple[list[Any], list[Any]]:
    """The confirmation before issue 37 item 4: every one of the `top` candidates confirmed."""
    return list(top), []


def confirmation_rule(variant: str) -> contextlib.AbstractContextManager[object]:
    """The product's rule (study.confirm), or an earlier one: before issue 41 for `per-look`; as issue 41
    left it for `confirm-41` (every candidate confirmed, no search launch counted as a round, the width
    judged at the looks' confidence); `keep-runner-up` and `no-search-rounds` one part of it as then."""
    from unittest import mock

    stack = contextlib.ExitStack()
    if variant == "per-look":
        stack.enter_context(mock.patch.object(confirm_rule, "look_confidence", per_look_confidence))
    if variant in ("confirm-41", "keep-runner-up"):
        stack.enter_context(mock.patch.object(confirm_rule, "contenders", every_candidate))
    if variant == "confirm-41":
        stack.enter_context(
            mock.patch.object(confirm_rule, "precision_confidence", confirm_rule.look_confidence)
        )
    return stack


def sampler_rule(variant: str) -> contextlib.AbstractContextManager[object]:
    """The default sampler with the variant's settings (SAMPLER_SETTINGS) over its own."""
    from unittest import mock

    from autotune.study import samplers

    stack = contextlib.ExitStack()
    if variant in SAMPLER_SETTINGS:
        default, changed = samplers.tpe, SAMPLER_SETTINGS[variant]

        def changed_tpe(seed: int | None, **settings: Any) -> optuna.samplers.BaseSampler:
            return default(seed, **{**changed, **settings})

        stack.enter_context(mock.patch.object(samplers, "tpe", changed_tpe))
        stack.enter_context(mock.patch.dict(samplers.SAMPLERS, {"tpe": changed_tpe}))
    return stack


@dataclass(frozen=True)
class Job:
    profile: Profile
    seed: int
    n_trials: int
    flat: bool
    compare_rounds: int
    trust: bool | dict[str, Any]  # the study file's section; `False` (before): a separate compare confirms
    variant: str = ""  # its name in VARIANTS, for the table ("before" or "after" when empty)

    @property
    def name(self) -> str:
        return self.variant or ("after" if self.trust is not False else "before")


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
    # Search launches that differed from an earlier launch only in knobs without effect.
    inert_launches: int = 0
    parts: tuple[tuple[str, float], ...] = ()  # node h by part (PARTS), summing to node_h
    # The answer's true value over the same config with NCCL's defaults, in percent: what the NCCL stage's
    # held values add to it (0 when the answer sets no NCCL knob).
    nccl_gain_pct: float = 0.0
    # The search's wait (issue 37 items 2/7): study node h until the first launch whose true value was within
    # the noise band of the answer's, the search launches after it, and their node h (the stopping rule's).
    found_h: float = 0.0
    waited_launches: int = 0
    waited_h: float = 0.0
    # Within the launches: node h of start-ups, and of the load steps at each load (a max_load's search).
    startup_h: float = 0.0
    steps_h: tuple[tuple[float, float], ...] = ()
    confirm_launches: int = 0  # the confirmation's own launches (its rounds; not the search's paired ones)


# Where a study's node hours go (issue 37's decomposition of the seed profile): its NCCL stage's all-reduce
# jobs, the baseline and its repeats, the search's launches that measured a value, those that failed or broke
# a limit, and the confirmation rounds.
PARTS = ("NCCL stage", "baseline + repeats", "search", "failed", "confirmation")


def parts(optuna_study: optuna.Study, clock: NodeClock) -> tuple[tuple[str, float], ...]:
    """The study's node hours by part (PARTS): every launch the clock timed, in one part each."""
    hours = dict.fromkeys(PARTS, 0.0)
    hours["NCCL stage"] = clock.stage_s / 3600
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    for number, seconds in clock.seconds.items():
        trial = trials.get(number)
        if trial is None or COMPARE_ATTR in trial.user_attrs:
            part = "confirmation"  # `before`'s separate compare
        elif CONFIRM_ATTR in trial.user_attrs:
            part = "confirmation"
        elif trial.user_attrs.get(BASELINE_ATTR):
            part = "baseline + repeats"
        elif trial.state is not TrialState.COMPLETE or not is_feasible(trial):
            part = "failed"
        else:
            part = "search"
        hours[part] += seconds / 3600
    return tuple(hours.items())


def steps_by_load(clock: NodeClock) -> tuple[tuple[float, float], ...]:
    """The node hours of the launches' measured levels at each load (a load search's steps), lowest load
    first; a plan's short measurement and a failed launch's benchmark are not among them."""
    hours: dict[float, float] = {}
    for steps in clock.steps.values():
        for load, seconds in steps:
            hours[load] = hours.get(load, 0.0) + seconds / 3600
    return tuple(sorted(hours.items()))


def steps_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Where a launch's node hours go, per profile and variant (not the flat landscapes), median over the
    seeds: the start-ups, and the load steps at each load with a share of the study's node hours over 2%."""
    lines = [
        "| profile | variant | node h, median | start-ups | load steps by load (req/s, in flight): node h |",
        "|---|---|---|---|---|",
    ]
    rows: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        if not o.job.flat:
            rows.setdefault((o.job.profile.key, o.job.name), []).append(o)
    for (key, name), group in rows.items():
        total = statistics.median(o.node_h for o in group)
        loads = sorted({load for o in group for load, _ in o.steps_h})
        medians = [(load, statistics.median(dict(o.steps_h).get(load, 0.0) for o in group)) for load in loads]
        shown = ", ".join(f"{load:g}: {h:.2f}" for load, h in medians if h >= 0.02 * total)
        startup = statistics.median(o.startup_h for o in group)
        lines.append(f"| {key} | {name} | {total:.2f} | {startup:.2f} | {shown} |")
    return lines


def search_wait(
    optuna_study: optuna.Study, clock: NodeClock, true_value: Callable[[Any], float], answer_true: float
) -> tuple[float, int, float]:
    """Where the answer was first found and what the search spent after it: the study's node hours (its
    NCCL stage and every launch in trial order) until the first search launch whose true value lies within
    the study's final noise band of the answer's (the answer itself at the latest), then the search
    launches (failed ones included) after it and their node hours."""
    estimate = noise_estimate(optuna_study)
    band = estimate.band(spread_known=True) if estimate is not None else 0.01
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    spent, found, waited, waited_s = clock.stage_s, None, 0, 0.0
    for number in sorted(clock.seconds):
        seconds, trial = clock.seconds[number], trials.get(number)
        search = (
            trial is not None
            and COMPARE_ATTR not in trial.user_attrs
            and CONFIRM_ATTR not in trial.user_attrs
            and not trial.user_attrs.get(BASELINE_ATTR)
        )
        if found is not None:
            waited += search
            waited_s += seconds if search else 0.0
            continue
        spent += seconds
        good = trial is not None and trial.state is TrialState.COMPLETE and is_feasible(trial)
        if good and true_value(trial) >= answer_true * (1 - band):
            found = spent
    return (found if found is not None else spent) / 3600, waited, waited_s / 3600


def dump(
    job: Job, optuna_study: optuna.Study, clock: NodeClock, true_value: Callable[[Any], float], answer: float
) -> None:
    """Write the study's trials, their true values and node seconds for benchmarks/stop_replay.py."""
    trials = optuna_study.get_trials(deepcopy=True)
    record = {
        "profile": job.profile.key,
        "flat": job.flat,
        "seed": job.seed,
        "variant": job.name,
        "trials": trials,
        "attrs": dict(optuna_study.user_attrs),
        "true": {
            t.number: true_value(t) for t in trials if t.state is TrialState.COMPLETE and is_feasible(t)
        },
        "answer_true": answer,
        "seconds": dict(clock.seconds),
        "stage_s": clock.stage_s,
    }
    name = f"{job.profile.key}-{'flat' if job.flat else 'gains'}-{job.name}-{job.seed}.pickle"
    (DUMP[0] / name).write_bytes(pickle.dumps(record))


_LANDSCAPES: dict[tuple[str, str], Landscape] = {}
MAX_LOAD = "max_load"


def landscape(profile: Profile) -> Landscape:
    """The noise-free landscape of `profile`, one per process (its launches cached); for a max_load
    objective (written by `max_load_profiles`), measured by the finer load search beside it (truth.yaml)."""
    key = (profile.key, str(profile.objective))
    if key not in _LANDSCAPES:
        truth = profile.objective.with_name("truth.yaml")
        plan = plan_for(load_objective(truth), short=False) if truth.exists() else None
        _LANDSCAPES[key] = Landscape(profile, Path(tempfile.mkdtemp(prefix="autotune-trust-")), plan)
    return _LANDSCAPES[key]


def max_load_profiles(chosen: Sequence[Profile]) -> list[Profile]:
    """benchmarks/peers/run.py's max_load profiles among `chosen`, each with its max_load objective (and the
    truth's finer search beside it) written to a folder of its own."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
    import run as peers  # benchmarks/peers/run.py: its objectives, only when asked for

    folder = Path(tempfile.mkdtemp(prefix="autotune-trust-max-load-"))
    return [
        peers.write_max_load_objectives(p, folder / p.key) for p in chosen if p.key in peers.MAX_LOAD_PROFILES
    ]


def true_gain_pct(true_value: float, base_true: float) -> float:
    """The answer's true gain over the defaults in percent; over defaults whose true value is 0 (a max_load:
    no rate meets the SLO) any value above 0 is a gain (infinite), 0 none."""
    if base_true:
        return (true_value / base_true - 1) * 100
    return math.inf if true_value > 0 else 0.0


def search_space(profile: Profile, flat: bool) -> dict[str, Any] | None:
    """The study's search space: the knobs the model ignores (and the real H200 study found inside the
    noise) for a flat landscape; the real study's for its profile; else the shipped one (None)."""
    real = yaml.safe_load(REAL_SPACE.read_text())
    if flat:
        return {**real, "parameters": {k: real["parameters"][k] for k in FLAT_KNOBS}}
    return real if profile.key == H200_X1.key else None


INERT = 1e-3  # a knob whose every move alone changes the true value by less than this has no effect
_INERT: dict[tuple[str, bool], frozenset[str]] = {}


def inert_knobs(profile: Profile, flat: bool, study: Study) -> frozenset[str]:
    """The knobs of the study's search space without effect on the model (no noise): moved alone to any of
    its values, from the defaults and from the best known config, the true value changes by under 0.1%."""
    key = (profile.key, flat)
    if key in _INERT:
        return _INERT[key]
    truth = landscape(profile)
    space = study.search_space
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    # The defaults: unset or off; a knob without either at the value SGLang chose (its memory fraction).
    chosen = {"--mem-fraction-static": round(truth.baseline_plan().mem_fraction_static, 2)}
    known = cached[profile.key]["params"] if profile.key in cached else None
    starts = [{}, *([known] if known else [])]
    values = {name: parameter_values(space, name) for name in space}

    def value(params: Params) -> float:
        return truth.value_of(space.suggest(optuna.trial.FixedTrial(params)))

    inert = set()
    for knob, parameter in space.parameters.items():
        if parameter.when or knob.startswith(("NCCL_", "--speculative")):
            continue  # held by the NCCL stage, or one of a tree's knobs that only pay off together
        changes = []
        for start in starts:
            params = {
                n: start.get(n, chosen.get(n, next((d for d in (None, False) if d in vs), vs[0])))
                for n, vs in values.items()
            }
            base = value(params)
            changes += [abs(value({**params, knob: v}) / base - 1) for v in values[knob] if base]
        if changes and max(changes) < INERT:
            inert.add(knob)
    _INERT[key] = frozenset(inert)
    return _INERT[key]


def inert_launches(launched: Sequence[Any], inert: frozenset[str]) -> int:
    """Search launches (not the baseline's repeats nor confirmation) whose config differs from an earlier
    launch's only in knobs without effect: budget spent on knobs that change nothing."""
    seen: set[tuple[tuple[str, str], ...]] = set()
    spent = 0
    for trial in sorted(launched, key=lambda t: t.number):
        if REMEASURE_OF_ATTR in trial.user_attrs:
            continue
        kept = {k: v for k, v in trial.params.items() if k not in inert and v is not None and v is not False}
        key = tuple(sorted((k, repr(v)) for k, v in kept.items()))
        spent += key in seen
        seen.add(key)
    return spent


def run_job(job: Job) -> Outcome:
    profile = job.profile
    truth = landscape(profile)
    base_true = truth.value_of(truth.space.baseline())

    def inspect(
        study: Study, optuna_study: optuna.Study, clock: NodeClock, rerun: Callable[[int], optuna.Study]
    ) -> Outcome:
        single = job.trust is False
        answer = single_measurement_answer(optuna_study) if single else study_answer(optuna_study)
        chosen = next(t for t in optuna_study.get_trials(deepcopy=False) if t.number == answer.trial)
        config = trial_config(study, chosen)
        true_value = truth.value_of(config)
        nccl_defaults = dataclasses.replace(
            config, env={k: v for k, v in config.env.items() if not k.startswith("NCCL_")}
        )
        without_nccl = truth.value_of(nccl_defaults)
        confirmed_claims = answer.confirmed and answer.claims_gain
        if job.trust is False and answer.claims_gain:
            # The separate compare, as the real run's: on the next lease, with draws of its own.
            clock.lease, clock.lease_every = 1 + job.n_trials // LEASE_EVERY, 0
            clock.noise_seed += 5000
            gain = compare(study, optuna_study, job.compare_rounds, trial=answer.trial, run=rerun).gain()
            confirmed_claims = gain is not None and gain.verdict == "gain"
        if DUMP:
            dump(job, optuna_study, clock, lambda t: truth.value_of(trial_config(study, t)), true_value)
        found_h, waited, waited_h = search_wait(
            optuna_study, clock, lambda t: truth.value_of(trial_config(study, t)), true_value
        )
        launched = [  # the study's: the separate compare's apart (its node time counts in node_h)
            t
            for t in optuna_study.get_trials(deepcopy=False)
            if NODE_ATTR in t.user_attrs and COMPARE_ATTR not in t.user_attrs
        ]
        return Outcome(
            job=job,
            trials=sum(1 for t in launched if REMEASURE_OF_ATTR not in t.user_attrs),
            launches=len(launched),
            claims_gain=answer.claims_gain,
            confirmed_claims_gain=confirmed_claims,
            claimed_gain_pct=answer.gain_pct if answer.claims_gain and answer.gain_pct is not None else 0.0,
            true_gain_pct=true_gain_pct(true_value, base_true),
            true_value=true_value,
            node_h=clock.total_s / 3600,
            inert_launches=inert_launches(launched, inert_knobs(profile, job.flat, study)),
            parts=parts(optuna_study, clock),
            startup_h=sum(clock.startup_s.values()) / 3600,
            steps_h=steps_by_load(clock),
            nccl_gain_pct=(true_value / without_nccl - 1) * 100 if without_nccl else 0.0,
            found_h=found_h,
            waited_launches=waited,
            waited_h=waited_h,
            confirm_launches=sum(1 for t in launched if CONFIRM_ATTR in t.user_attrs),
        )

    noise = SimNoise.calibrated(load_hardware_profile(profile.hardware).noise)
    with confirmation_rule(job.variant), sampler_rule(job.variant):
        run = run_study(
            profile,
            job.n_trials,
            seed=job.seed,
            noise=noise,
            lease_every=LEASE_EVERY,
            search_space=search_space(profile, job.flat),
            # One GPU has no all-reduces to tune.
            nccl_stage=not job.flat and profile.tp > 1 and job.variant not in NO_STAGE,
            trust=job.trust,
            inspect=inspect,
            node_hours=HALF_HOURS[(profile.key, job.flat)] if job.variant == "half-hours" else None,
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
    """The variants side by side, the same seeds: per profile, then the flat landscape. "before" has two
    columns for (a): the study alone, and once its separate compare confirmed the claim."""
    names = list(dict.fromkeys(o.job.name for o in outcomes))

    def of(rows: list[Outcome], name: str) -> list[Outcome]:
        return [o for o in rows if o.job.name == name]

    def false_gains(rows: list[Outcome], confirmed: bool) -> str:
        claims = [(o.confirmed_claims_gain if confirmed else o.claims_gain) for o in rows]
        return pct(sum(c and o.true_gain_pct <= 0 for c, o in zip(claims, rows, strict=True)), len(rows))

    def hours(rows: list[Outcome]) -> str:
        return f"{statistics.median(o.node_h for o in rows):.2f}" if rows else "-"

    def worth(rows: list[Outcome], key: str) -> str:
        ratios = [o.true_value / best_known[key] for o in rows] if key in best_known and rows else []
        return f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"

    def median(rows: list[Outcome], field: str) -> str:
        return f"{statistics.median(getattr(o, field) for o in rows):.0f}" if rows else "-"

    def cells(rows: list[Outcome], cell: Any) -> list[str]:
        return [cell(of(rows, name)) for name in names]

    def header(label: str) -> list[str]:
        return [f"{label}: {name}" if i == 0 else name for i, name in enumerate(names)]

    def split_label(label: str, i: int, name: str) -> str:
        text = f"{name}, study alone | {name}, after compare" if name == "before" else name
        return f"{label}: {text}" if i == 0 else text

    columns = [
        "profile",
        "seeds",
        *(split_label("(a) claims a gain whose true value <= 0", i, n) for i, n in enumerate(names)),
        *header("(b) median node h to a confirmed answer"),
        *header("(c) true value / best known, median (min)"),
        *header("launches, median"),
        *header("launches on knobs without effect, median"),
    ]
    width = len(" | ".join(columns).split(" | "))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * width]
    by_profile: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.job.flat:
            by_profile.setdefault(o.job.profile.key, []).append(o)
    for key, rows in by_profile.items():
        a = [
            f"{false_gains(r, False)} | {false_gains(r, True)}" if n == "before" else false_gains(r, True)
            for n, r in ((n, of(rows, n)) for n in names)
        ]
        row = [
            key,
            str(len(of(rows, names[0]))),
            *a,
            *cells(rows, hours),
            *cells(rows, lambda r, key=key: worth(r, key)),
            *cells(rows, lambda r: median(r, "launches")),
            *cells(rows, lambda r: median(r, "inert_launches")),
        ]
        lines.append("| " + " | ".join(row) + " |")
    flat = [o for o in outcomes if o.job.flat]
    if flat:
        columns = [
            "profile",
            "seeds",
            *header("trials before the study stops"),
            *(split_label("reports no gain", i, n) for i, n in enumerate(names)),
            *header("median node h"),
            *header("launches, median"),
            *header("launches on knobs without effect, median"),
        ]
        width = len(" | ".join(columns).split(" | "))
        lines += [
            "",
            "(d) Flat landscape (" + ", ".join(f"`{k}`" for k in FLAT_KNOBS) + ": knobs the model ignores)",
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * width,
        ]

        def no_gain(r: list[Outcome], name: str) -> str:
            if name == "before":
                return (
                    f"{pct(sum(not o.claims_gain for o in r), len(r))} | "
                    f"{pct(sum(not o.confirmed_claims_gain for o in r), len(r))}"
                )
            return pct(sum(not o.confirmed_claims_gain for o in r), len(r))

        for key in dict.fromkeys(o.job.profile.key for o in flat):
            rows = [o for o in flat if o.job.profile.key == key]
            row = [
                key,
                str(len(of(rows, names[0]))),
                *cells(rows, lambda r: median(r, "trials")),
                *[no_gain(of(rows, n), n) for n in names],
                *cells(rows, hours),
                *cells(rows, lambda r: median(r, "launches")),
                *cells(rows, lambda r: median(r, "inert_launches")),
            ]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def parts_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Where the node hours go, per profile and variant (not the flat landscapes): the median of each part
    over the seeds, and the median total (the medians of the parts need not add up to it); and what the
    NCCL values the answer sets add to its true tok/s (those the stage held, or the search chose)."""
    lines = [
        "| profile | variant | "
        + " | ".join(PARTS)
        + " | total, median | confirmation launches, median | NCCL values' gain in the answer, median"
        + " | answer first launched at node h | search launches after it | their node h |",
        "|" + "---|" * (len(PARTS) + 8),
    ]
    rows: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        if not o.job.flat:
            rows.setdefault((o.job.profile.key, o.job.name), []).append(o)
    for (key, name), group in rows.items():
        medians = [statistics.median(dict(o.parts)[part] for o in group) for part in PARTS]
        total = statistics.median(o.node_h for o in group)
        gain = statistics.median(o.nccl_gain_pct for o in group)
        cells = " | ".join(f"{h:.2f}" for h in medians)
        found = statistics.median(o.found_h for o in group)
        waited = statistics.median(o.waited_launches for o in group)
        waited_h = statistics.median(o.waited_h for o in group)
        confirming = statistics.median(o.confirm_launches for o in group)
        lines.append(
            f"| {key} | {name} | {cells} | {total:.2f} | {confirming:g} | {gain:+.1f}% "
            f"| {found:.2f} | {waited:.0f} | {waited_h:.2f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: one profile, one seed, 6 trials")
    parser.add_argument("--seeds", type=int, default=10, help="studies per profile (default 10)")
    parser.add_argument("--jobs", type=int, default=2, help="studies run in parallel (default 2)")
    parser.add_argument("--profile", action="append", help="only these profiles (by key; repeatable)")
    parser.add_argument(
        "--variants",
        default="before,after",
        help=f"the trust sections measured side by side, of {', '.join(VARIANTS)} (default before,after)",
    )
    parser.add_argument(
        "--per-study",
        action="store_true",
        help="also a line per study: its answer, cost and the search's wait",
    )
    parser.add_argument(
        "--dump", type=Path, help="write each study's trials there (benchmarks/stop_replay.py)"
    )
    parser.add_argument(
        "--objective",
        choices=["throughput", MAX_LOAD],
        default="throughput",
        help="the profiles' output tok/s (default), or benchmarks/peers/run.py's max_load",
    )
    args = parser.parse_args(argv)
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        DUMP[:] = [args.dump]
    seeds = 1 if args.quick else args.seeds
    n_trials = 6 if args.quick else N_TRIALS
    rounds = 2 if args.quick else COMPARE_ROUNDS
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    chosen = [p for p in profiles(args.quick) if not args.profile or p.key in args.profile]
    if args.objective == MAX_LOAD:
        chosen = max_load_profiles(chosen)
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown variant {unknown[0]!r}: choose among {', '.join(VARIANTS)}")
    jobs = [
        Job(p, s, n_trials, flat, rounds, VARIANTS[variant], variant)
        for p in chosen
        for s in range(seeds)
        for flat in (False, True)
        for variant in variants
    ]
    if args.quick:
        jobs = [job for job in jobs if job.profile.key == "h200"][:4]
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    best_known = {key: entry["tok_s"] for key, entry in cached.items()} if args.objective != MAX_LOAD else {}
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        outcomes = studies_in_pool(pool, run_job, jobs, started)
    order = {p.key: i for i, p in enumerate(chosen)}
    outcomes.sort(
        key=lambda o: (o.job.flat, order[o.job.profile.key], variants.index(o.job.name), o.job.seed)
    )
    print(
        f"## Trust, {' / '.join(variants)}: {n_trials}-trial TPE studies with calibrated noise (a new lease "
        f"every {LEASE_EVERY} trials), {seeds} seeds; before: `trust: off` and a compare of {rounds} rounds; "
        "after: the trust defaults; the others: the defaults with one part changed (VARIANTS)\n"
    )
    print("\n".join(table(outcomes, best_known)))
    print("\nNode hours by part, median over the seeds (where gains exist)\n")
    print("\n".join(parts_table(outcomes)))
    if args.objective == MAX_LOAD:
        print("\nWithin the launches: start-ups and load steps, median over the seeds (where gains exist)\n")
        print("\n".join(steps_table(outcomes)))
    if args.per_study:
        print("\nPer study: profile, flat, variant, seed, launches, node h, true / best known, answer first")
        print("launched at node h, search launches after it, their node h\n")
        for o in outcomes:
            known = best_known.get(o.job.profile.key)
            worth = f"{o.true_value / known:.3f}" if known else "-"
            print(
                f"{o.job.profile.key} {'flat' if o.job.flat else 'gains'} {o.job.name} {o.job.seed} "
                f"{o.launches} {o.node_h:.2f} {worth} {o.found_h:.2f} {o.waited_launches} {o.waited_h:.2f}"
            )
    print(f"\n{len(outcomes)} studies in {time.monotonic() - started:.0f} s on {args.jobs} processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
