"""autotune and SGLang's own auto_benchmark side by side: the same simulated node, workload and noise.

On the seed profile, the H200 profile and benchmarks/profiles/*.yaml, over several seeds (the noise's draws,
and autotune's sampler), it runs:

- SGLang's auto_benchmark (harness.py: its own code from the sglang 0.5.16 wheel, its launches and
  bench_serving runs answered by the simulated node's model), with its cookbook entry for the model:
  `ab-tier2` its default (tier 2, 8 candidates), `ab-tier3` its tier 3 (the cookbook's 8 candidates), and
  `ab-tier2+spec` its default with its speculative stage on (the profile's EAGLE-3 draft given);
- autotune with its defaults (trust on: the baseline repeated, no launch made twice, the stopping rule, the
  winner confirmed), `--n-trials` launches of the shipped search space, on the same model node;
- `autotune@2x-ab-tier2`: the same, given a node-hour budget (the study file's `budget: {node_hours: H}`) of
  twice what ab-tier2 spent on the same profile, objective and seed (issue 37's goal).

The seed profile runs twice: on its hardware profile's 512 GB of host memory, which cannot keep its 547 GB of
weights in the page cache, and as `seed-1tb-host` (profiles/: the same node with 1024 GB, where every launch
after the first reads the weights from memory): the seed does not say which its node has.

Both measure through `NodeClock` (benchmarks/model_studies.py) with the run-to-run noise calibrated on the
real H200 runs and a new lease every 10 launches, as benchmarks/trust.py does. Two objectives: output tok/s
at the profile's workload concurrency (autotune's objective for the profile), and the highest request rate
within the cookbook's SLO (max_load; MAX_LOAD_PROFILES only: auto_benchmark's QPS search against autotune's
load search). Per run: the true value (the model
without noise) of the config the tool answers with, against the best known config (best_known.json) and
SGLang's defaults; node hours (start-ups and benchmarks as the model times them; autotune's NCCL stage
included); launches and failed launches; node hours until the tool first launched a config whose true
value is within 2% of its final answer's.

    python benchmarks/peers/run.py [--quick] [--seeds 3] [--jobs 2] [--profile KEY] [--objective max_load]
    python benchmarks/peers/run.py --e2e seed --time-scale 0.1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

PEERS = Path(__file__).resolve().parent
sys.path.insert(0, str(PEERS))
sys.path.insert(0, str(PEERS.parent))

import harness  # noqa: E402
from model_studies import (  # noqa: E402
    BENCHMARKS,
    NODE,
    PROFILES,
    Landscape,
    NodeClock,
    Profile,
    load_profile,
    run_study,
    studies_in_pool,
)
from sample_efficiency import BEST_KNOWN  # noqa: E402

from autotune.config import Study, load_objective  # noqa: E402
from autotune.measure.plan import plan_for  # noqa: E402
from autotune.sim.model.noise import SimNoise  # noqa: E402
from autotune.sim.model_node import ModelNodeExecutor  # noqa: E402
from autotune.sim.profiles import load_hardware_profile, load_model_profile  # noqa: E402
from autotune.study.rules import trial_config, within_limits  # noqa: E402
from autotune.study.trust.answer import study_answer  # noqa: E402
from autotune.trial.launch import ServerLaunch, TrialConfig  # noqa: E402
from autotune.trial.wire import TrialRequest  # noqa: E402

N_TRIALS = 40  # autotune's budget (benchmarks/trust.py's); its stopping rule may end a study sooner
LEASE_EVERY = 10  # a new lease of the machine every 10 launches, as in benchmarks/trust.py
WITHIN = 0.02  # "its first config within 2% of its final answer"
AUTOTUNE = "autotune"
BUDGETED = "autotune@2x-ab-tier2"  # autotune given BUDGET_FACTOR x ab-tier2's node hours of the same run
BUDGET_FACTOR = 2.0
AUTOTUNES = (AUTOTUNE, BUDGETED)
SEED_PAGE_CACHE = PEERS / "profiles" / "seed-1tb-host.yaml"  # the seed's node with 1024 GB of host memory
# max_load runs on these profiles only (a table over all four does not fit in minutes here); the seed node
# decodes Kimi-K2.5 slower than the cookbook's 30 ms per token at any rate: no config meets that SLO.
MAX_LOAD_PROFILES = ("h200", "heldout-l40sx4-qwen32b")
THROUGHPUT, MAX_LOAD = "throughput", "max_load"
# The max_load objective: objectives/max-load-slo.yaml's load search (autotune's shipped defaults), on the
# profile's prompt and output lengths, with the cookbook's SLA numbers and num_prompts, no cap in flight.
MAX_LOAD_PROMPTS = 80
LOAD_SEARCH = {
    "vary": "request_rate", "start": 0.5, "max": 16, "min": 0.0625, "steps": 6, "attainment": 0.9,
    "tolerance": 0.1,
}  # fmt: skip
# The true max_load of a config: the same search, up to 128 req/s, to a 2% bracket, without noise, every
# step's prompts all sent (a step decided early would move the yardstick).
TRUE_LOAD_SEARCH = {**LOAD_SEARCH, "max": 128, "steps": 14, "tolerance": 0.02, "stop_when_decided": False}


@dataclass(frozen=True)
class Job:
    profile: Profile
    tool: str  # AUTOTUNE or a harness.Variant key
    seed: int
    n_trials: int
    objective: str = THROUGHPUT  # or MAX_LOAD (the profile's objective file is then the max_load one)


@dataclass(frozen=True)
class Outcome:
    """One run of one tool: the true value of its answer and what it cost."""

    job: Job
    true_value: float  # output tok/s of the answer's config without noise (0: no answer)
    defaults_value: float  # SGLang's defaults without noise
    node_h: float
    launches: int
    failed: int
    h_to_within: float | None  # node hours until its first launch within WITHIN of the answer's true value
    note: str = ""
    # Each launch in order: the node hours spent through it, and its config's true value.
    curve: tuple[tuple[float, float], ...] = ()
    budget_h: float | None = None  # the node-hour budget it was given (BUDGETED)

    def best_within(self, hours: float) -> float:
        """The best true value among the launches made within `hours` of node time (0: none)."""
        return max((v for h, v in self.curve if h <= hours + 1e-9), default=0.0)

    def hours_to(self, value: float) -> float | None:
        """Node hours through the first launch whose true value reaches `value` (None: never)."""
        return next((h for h, v in self.curve if v >= value * (1 - 1e-9)), None)


class Truth:
    """The noise-free objective value of a launch on `profile`'s model node (0 when the launch fails or
    breaks a limit): output tok/s of the objective's workload, or the objective's max_load measured by
    `truth_objective`'s finer load search."""

    def __init__(self, profile: Profile, truth_objective: Path | None = None) -> None:
        self.landscape = Landscape(profile, Path(tempfile.mkdtemp(prefix="autotune-peers-")))
        self.study = self.landscape.study
        hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
        self._executor = ModelNodeExecutor(NODE, hardware, model)
        self._plan = None
        if truth_objective is not None:
            self._plan = plan_for(load_objective(truth_objective), short=False)
        self._cache: dict[tuple[object, ...], float] = {}

    def of_launch(self, argv: Sequence[str], env: dict[str, str]) -> float:
        """`argv`: the server's flags, or the whole command (the model node reads from --model-path)."""
        key = (tuple(argv), tuple(sorted(env.items())))
        if key not in self._cache:
            objective = self.study.objective
            command = (
                tuple(argv) if argv[0] != "--model-path" else ("python", "-m", harness.LAUNCH_SERVER, *argv)
            )
            server = ServerLaunch(command, dict(env), "127.0.0.1", 30000)
            request = TrialRequest(0, server, objective.workload, 1.0, 1.0, plan=self._plan)
            result = self._executor.run(request).benchmark
            ok = result is not None and within_limits(objective.constraints(result))
            self._cache[key] = objective.value(result) if ok else 0.0
        return self._cache[key]

    def of_config(self, config: TrialConfig) -> float:
        launch = self.study.server_launch(config)
        return self.of_launch(launch.argv, dict(launch.env))

    @property
    def defaults(self) -> float:
        return self.of_config(self.landscape.space.baseline())


_TRUTHS: dict[tuple[str, str], Truth] = {}


def truth(job: Job) -> Truth:
    key = (job.profile.key, job.objective)
    if key not in _TRUTHS:
        finer = job.profile.objective.with_name("truth.yaml") if job.objective == MAX_LOAD else None
        _TRUTHS[key] = Truth(job.profile, finer)
    return _TRUTHS[key]


def write_max_load_objectives(profile: Profile, folder: Path) -> Profile:
    """`profile` with the max_load objective on its workload's lengths (and, beside it, truth.yaml: the
    same with TRUE_LOAD_SEARCH), written to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    w = load_objective(profile.objective).workload
    assert w is not None
    workload = {
        "num_prompts": MAX_LOAD_PROMPTS,
        "input_len": w.input_len,
        "output_len": w.output_len,
        "concurrency": MAX_LOAD_PROMPTS,
        "warmup_requests": 0,
        "slo": {"ttft_ms": harness.SLA["max_ttft_ms"], "tpot_ms": harness.SLA["max_tpot_ms"]},
    }
    for name, search in (("objective.yaml", LOAD_SEARCH), ("truth.yaml", TRUE_LOAD_SEARCH)):
        data = {
            "name": f"max-load-{profile.key}",
            "metric": "max_load",
            "workload": workload,
            "load_search": search,
        }
        (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return replace(profile, objective=folder / "objective.yaml")


def hours_to_within(values: Sequence[float], seconds: Sequence[float], answer: float) -> float | None:
    """Node hours through the first launch whose true value is within WITHIN of `answer` (None: no answer)."""
    if answer <= 0:
        return None
    spent = 0.0
    for value, s in zip(values, seconds, strict=True):
        spent += s
        if value >= (1 - WITHIN) * answer:
            return spent / 3600
    return None


def curve(values: Sequence[float], seconds: Sequence[float]) -> tuple[tuple[float, float], ...]:
    spent, points = 0.0, []
    for value, s in zip(values, seconds, strict=True):
        spent += s
        points.append((spent / 3600, value))
    return tuple(points)


def noise_of(profile: Profile) -> SimNoise:
    return SimNoise.calibrated(load_hardware_profile(profile.hardware).noise)


def run_auto_benchmark_job(job: Job) -> Outcome:
    profile, known = job.profile, truth(job)
    variant = next(v for v in harness.VARIANTS if v.key == job.tool)
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    clock = NodeClock(NODE, hardware, model, noise_of(profile), noise_seed=job.seed, lease_every=LEASE_EVERY)
    workload = known.study.objective.workload
    assert workload is not None
    node = harness.ModelSubprocess(clock, workload)
    with tempfile.TemporaryDirectory(prefix="autotune-peers-ab-") as folder:
        config = harness.auto_benchmark_config(
            profile, workload, variant, Path(folder) / "results", max_load=job.objective == MAX_LOAD
        )
        run = harness.run_auto_benchmark(config, node, Path(folder))
    env = dict(config["server"].get("env", {}))
    values = [0.0 if launch.failed else known.of_launch(launch.argv, launch.env) for launch in run.launches]
    answer = known.of_launch(run.best_argv, env) if run.best_argv is not None else 0.0
    return Outcome(
        job,
        answer,
        known.defaults,
        sum(launch.seconds for launch in run.launches) / 3600,
        len(run.launches),
        sum(launch.failed for launch in run.launches),
        hours_to_within(values, [launch.seconds for launch in run.launches], answer),
        run.error,
        curve(values, [launch.seconds for launch in run.launches]),
    )


def run_autotune_job(job: Job, node_hours: float | None = None) -> Outcome:
    profile, known = job.profile, truth(job)

    def inspect(study: Study, optuna_study: optuna.Study, clock: NodeClock, rerun: object) -> Outcome:
        record = study_answer(optuna_study)
        trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
        launched = [trials[n] for n in sorted(clock.seconds)]
        values = [
            known.of_config(trial_config(study, t)) if t.state is TrialState.COMPLETE else 0.0
            for t in launched
        ]
        seconds = clock.launch_seconds([t.number for t in launched])
        answer = known.of_config(trial_config(study, trials[record.trial])) if record else 0.0
        return Outcome(
            job,
            answer,
            known.defaults,
            clock.total_s / 3600,
            len(launched),
            sum(t.state is not TrialState.COMPLETE for t in launched),
            hours_to_within(values, seconds, answer),
            "" if record is None else ("confirmed" if record.confirmed else "unconfirmed"),
            curve(values, seconds),
            node_hours,
        )

    result = run_study(
        profile,
        job.n_trials,
        seed=job.seed,
        noise=noise_of(profile),
        lease_every=LEASE_EVERY,
        nccl_stage=profile.tp > 1,
        trust=True,
        inspect=inspect,
        node_hours=node_hours,
    )
    outcome: Outcome = result.inspected
    return outcome


def run_budgeted_job(job: Job) -> Outcome:
    """autotune given BUDGET_FACTOR x the node hours ab-tier2 spends on the same run (ab-tier2 run here
    again: it is deterministic but for the noise's draws, which the seed fixes)."""
    ab = run_auto_benchmark_job(replace(job, tool=harness.VARIANTS[0].key))
    return run_autotune_job(job, node_hours=BUDGET_FACTOR * ab.node_h)


def run_job(job: Job) -> Outcome:
    if job.tool == AUTOTUNE:
        return run_autotune_job(job)
    return run_budgeted_job(job) if job.tool == BUDGETED else run_auto_benchmark_job(job)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def end_to_end(profile: Profile, time_scale: float) -> list[str]:
    """auto_benchmark's default run (ab-tier2) twice without noise: against real simulated server processes
    (auto_benchmark's own launches and subprocesses; the benchmark client is autotune's, shim/), and on
    the model node as the table's runs; each candidate's output tok/s side by side."""
    known = truth(Job(profile, harness.VARIANTS[0].key, 0, 0))
    workload = known.study.objective.workload
    assert workload is not None
    variant = harness.VARIANTS[0]
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    with tempfile.TemporaryDirectory(prefix="autotune-peers-e2e-") as folder:
        config = harness.auto_benchmark_config(profile, workload, variant, Path(folder) / "model")
        node = harness.ModelSubprocess(NodeClock(NODE, hardware, model), workload)
        modelled = harness.run_auto_benchmark(config, node, Path(folder)).records
        config = harness.auto_benchmark_config(
            profile,
            workload,
            variant,
            Path(folder) / "e2e",
            command_prefix=[sys.executable, "-m", "autotune.sim.sglang_server"],
            port=free_port(),
        )
        config["server"]["env"] = {
            "SGLANG_SIM_HARDWARE": profile.hardware,
            "SGLANG_SIM_MODEL": profile.model,
            "SGLANG_SIM_TIME_SCALE": str(time_scale),
            "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001",
        }
        config["benchmark"]["ready_check_timeout_sec"] = 120
        started = time.monotonic()
        real = harness.run_auto_benchmark_e2e(config, Path(folder))
        took = time.monotonic() - started
    lines = [
        f"## auto_benchmark ab-tier2 on {profile.key}: real simulated servers (time scale {time_scale}) "
        f"against the model node, no noise ({took:.0f} s)\n",
        "| candidate | flags beyond the cookbook's baseline | model node tok/s | real servers tok/s "
        "| ratio |",
        "|---|---|---|---|---|",
    ]
    base = set(config["server"]["base_flags"]) | {"host", "port"}
    for m, r in zip(modelled, real, strict=False):
        flags = {k: v for k, v in r["server_flags"].items() if k not in base}
        a = m.get("metrics", {}).get("output_throughput", 0.0)
        b = r.get("metrics", {}).get("output_throughput", 0.0)
        ratio = b / a if a else float("nan")
        lines.append(f"| {r['candidate_id']} | {flags or '-'} | {a:.1f} | {b:.1f} | {ratio:.3f} |")
    ab = harness.load_auto_benchmark()
    best_m, best_r = ab.best_record(modelled), ab.best_record(real)
    lines.append(
        f"\nbest candidate: model node {best_m and best_m['candidate_id']}, real servers "
        f"{best_r and best_r['candidate_id']}; {len(real)} launches"
    )
    return lines


def profiles(quick: bool) -> list[Profile]:
    if quick:
        return [PROFILES["h200"]]
    files = sorted((BENCHMARKS / "profiles").glob("*.yaml"))
    seed = [PROFILES["seed"], load_profile(str(SEED_PAGE_CACHE))]
    return [*seed, PROFILES["h200"], *(load_profile(str(path)) for path in files)]


def table(outcomes: Sequence[Outcome], best_known: dict[str, float], unit: str) -> list[str]:
    """Per profile and tool, over the seeds: medians (and the worst) of the answer's worth and the cost."""

    def median(values: Sequence[float | None], fmt: str) -> str:
        present = [v for v in values if v is not None]
        return format(statistics.median(present), fmt) if present else "-"

    lines = [
        f"| profile | tool | runs | answer's true {unit}, median | / reference, median (min) | vs SGLang's "
        "defaults, median | node h, median | launches, median | failed launches, median | node h to "
        "first within 2% of its answer, median |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.job.profile.key, o.job.tool), []).append(o)
    for (key, tool), rows in groups.items():
        ratios = [o.true_value / best_known[key] for o in rows] if key in best_known else []
        worth = f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"
        gains = [(o.true_value / o.defaults_value - 1) * 100 for o in rows if o.defaults_value]
        lines.append(
            f"| {key} | {tool} | {len(rows)} | {median([o.true_value for o in rows], '.1f')} | {worth} | "
            f"{median(gains, '+.1f')}% | {median([o.node_h for o in rows], '.2f')} | "
            f"{median([o.launches for o in rows], '.0f')} | {median([o.failed for o in rows], '.0f')} | "
            f"{median([o.h_to_within for o in rows], '.2f')} |"
        )
    return lines


def same_budget(outcomes: Sequence[Outcome], best_known: dict[str, float]) -> list[str]:
    """Each auto_benchmark run against autotune's run of the same seed, cut at auto_benchmark's node hours:
    the best config autotune had launched by then (its true value; not yet its confirmed answer), and the
    node hours autotune took to first launch a config as good as auto_benchmark's answer."""
    runs = {(o.job.profile.key, o.job.tool, o.job.seed): o for o in outcomes}
    lines = [
        "| profile | auto_benchmark | its answer / reference, median | autotune's best launch within the "
        "same node h / reference, median | autotune's node h to a launch as good as its answer, median "
        "(its own node h) |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[tuple[Outcome, Outcome]]] = {}
    for (key, tool, seed), o in runs.items():
        mine = runs.get((key, AUTOTUNE, seed))
        if tool not in AUTOTUNES and mine is not None and key in best_known:
            groups.setdefault((key, tool), []).append((o, mine))
    for (key, tool), pairs in groups.items():
        known = best_known[key]
        theirs = statistics.median(o.true_value / known for o, _ in pairs)
        ours = statistics.median(m.best_within(o.node_h) / known for o, m in pairs)
        reach = [m.hours_to(o.true_value) for o, m in pairs]
        reached = [h for h in reach if h is not None]
        when = f"{statistics.median(reached):.2f}" if reached else "never"
        spent = statistics.median(o.node_h for o, _ in pairs)
        lines.append(f"| {key} | {tool} | {theirs:.3f} | {ours:.3f} | {when} ({spent:.2f}) |")
    return lines


def budgeted(outcomes: Sequence[Outcome], best_known: dict[str, float]) -> list[str]:
    """Per profile, autotune given a node-hour budget (BUDGETED): the budget, what it spent, how often it
    ended within it, its answer's worth and how many answers were confirmed."""
    lines = [
        "| profile | runs | budget (node h), median | node h spent, median (max) | ended within its budget | "
        "answer / reference, median (min) | confirmed |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.job.tool == BUDGETED and o.budget_h is not None:
            groups.setdefault(o.job.profile.key, []).append(o)
    for key, rows in groups.items():
        budgets = [o.budget_h for o in rows if o.budget_h is not None]
        within = sum(o.node_h <= b + 1e-9 for o, b in zip(rows, budgets, strict=True))
        known = best_known.get(key)
        ratios = [o.true_value / known for o in rows] if known else []
        worth = f"{statistics.median(ratios):.3f} ({min(ratios):.3f})" if ratios else "-"
        spent = [o.node_h for o in rows]
        lines.append(
            f"| {key} | {len(rows)} | {statistics.median(budgets):.2f} | {statistics.median(spent):.2f} "
            f"({max(spent):.2f}) | {within}/{len(rows)} | {worth} | "
            f"{sum(o.note == 'confirmed' for o in rows)}/{len(rows)} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: the H200 profile, output tok/s, one seed, 8 trials"
    )
    parser.add_argument("--seeds", type=int, default=3, help="runs per profile and tool (default 3)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    parser.add_argument(
        "--n-trials", type=int, default=N_TRIALS, help=f"autotune's budget (default {N_TRIALS})"
    )
    parser.add_argument("--profile", action="append", help="only these profiles (by key; repeatable)")
    parser.add_argument(
        "--e2e", metavar="PROFILE", help="instead: auto_benchmark against real simulated servers on PROFILE"
    )
    parser.add_argument("--time-scale", type=float, default=0.05, help="the servers' time scale for --e2e")
    parser.add_argument(
        "--objective",
        choices=[THROUGHPUT, MAX_LOAD],
        action="append",
        help="only these objectives (default both)",
    )
    args = parser.parse_args(argv)
    if args.e2e:
        print("\n".join(end_to_end(load_profile(args.e2e), args.time_scale)))
        return 0
    seeds = 1 if args.quick else args.seeds
    n_trials = 8 if args.quick else args.n_trials
    tools = [*AUTOTUNES, *(v.key for v in harness.VARIANTS)]
    objectives = args.objective or ([THROUGHPUT] if args.quick else [THROUGHPUT, MAX_LOAD])
    chosen = [p for p in profiles(args.quick) if not args.profile or p.key in args.profile]
    harness.load_auto_benchmark()  # download the wheel once, before the workers fork
    folder = Path(tempfile.mkdtemp(prefix="autotune-peers-objectives-"))
    jobs = []
    for objective in objectives:
        for p in chosen:
            if objective == MAX_LOAD and p.key not in MAX_LOAD_PROFILES:
                continue
            if objective == MAX_LOAD:
                p = write_max_load_objectives(p, folder / p.key)
            jobs += [Job(p, tool, s, n_trials, objective) for tool in tools for s in range(seeds)]
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    best_known = {key: entry["tok_s"] for key, entry in cached.items()}
    # Host memory changes the start-up only, not what a config serves: the seed's best known holds there.
    if "seed" in best_known:
        best_known.setdefault(load_profile(str(SEED_PAGE_CACHE)).key, best_known["seed"])
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        outcomes = studies_in_pool(pool, run_job, jobs, started)
    order = {p.key: i for i, p in enumerate(chosen)}
    outcomes.sort(key=lambda o: (order[o.job.profile.key], tools.index(o.job.tool), o.job.seed))
    for objective in objectives:
        rows = [o for o in outcomes if o.job.objective == objective]
        if objective == THROUGHPUT:
            reference, unit = best_known, "tok/s"
            print(
                "## Output tok/s at the workload's concurrency: autotune and SGLang's auto_benchmark "
                f"(sglang {harness.SGLANG_RELEASE} wheel), calibrated noise (a new lease every {LEASE_EVERY} "
                f"launches), {seeds} seeds; autotune: its defaults, {n_trials} trials; reference: the best "
                "known config\n"
            )
        else:
            # No best known config for this objective: the best true value either tool's answer reached.
            reference, unit = {}, "req/s"
            for o in rows:
                reference[o.job.profile.key] = max(reference.get(o.job.profile.key, 0.0), o.true_value)
            sla = harness.SLA
            print(
                f"\n## The highest request rate within the SLO (TTFT {sla['max_ttft_ms']} ms, TPOT "
                f"{sla['max_tpot_ms']} ms), {MAX_LOAD_PROMPTS} prompts, no cap in flight; {seeds} seeds; "
                "reference: the best answer of either tool on the profile\n"
            )
        print("\n".join(table(rows, reference, unit)))
        print("\nThe same node hours: each auto_benchmark run against autotune's run of the same seed\n")
        print("\n".join(same_budget(rows, reference)))
        budget = "`budget: {node_hours: H}`"
        print(f"\nautotune given {BUDGET_FACTOR:g}x ab-tier2's node hours of the same run ({budget})\n")
        print("\n".join(budgeted(rows, reference)))
    notes = sorted(
        {f"{o.job.profile.key} {o.job.tool} {o.job.objective}: {o.note}" for o in outcomes
         if o.note and o.job.tool not in AUTOTUNES}
    )  # fmt: skip
    if notes:
        print("\nauto_benchmark stopped early: " + "; ".join(notes))
    for tool in AUTOTUNES:
        answers = [o for o in outcomes if o.job.tool == tool]
        print(f"\n{tool}'s answers: {sum(o.note == 'confirmed' for o in answers)}/{len(answers)} confirmed")
    print(f"\n{len(outcomes)} runs in {time.monotonic() - started:.0f} s on {args.jobs} processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
