"""Whole studies on the simulated node's model, run by the product's study loop, fast enough to run by the
thousand: the study file for a profile, a node that counts the node time its trials would take, and the
landscape (the tok/s of any config of the search space, asked the same way).

A study here runs through `StudyDriver` with a `LocalNodePool` of `ModelNodeExecutor`s, an in-memory Optuna
storage and no MLflow tracking, so the outcome rules (an OOM pruned with the penalty, a certain OOM
pruned by the pre-flight check without a launch, an unsupported flag remembered and never launched
again, skipped proposals not counted) are the product's own.
"""

from __future__ import annotations

import itertools
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import optuna
import yaml
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.config import Study, load_study
from autotune.config.search_space import FloatParameter, IntParameter, SearchSpace
from autotune.errors import ConfigError
from autotune.measure.plan import MeasurementPlan
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model import MemoryPlan, NodePerformanceModel
from autotune.sim.model.noise import SimNoise
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.predict import settings_for
from autotune.sim.profiles import HardwareProfile, ModelProfile, load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.study.rules import is_feasible, within_limits
from autotune.study.storage import counts
from autotune.study.trust.answer import study_answer
from autotune.trial.launch import TrialConfig
from autotune.trial.wire import TrialRequest, TrialResult

# Thousands of studies: Optuna's per-trial notes (GP falling back to random sampling for the conditional
# parameters, heartbeats outside Study.optimize) would bury the tables.
optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
SEARCH_SPACE = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
EP_SIZE = "--ep-size"
NODE = "node"
Params = dict[str, Any]  # a value per parameter name, as Optuna stores a trial's
JobT = TypeVar("JobT")
DoneT = TypeVar("DoneT")


@dataclass(frozen=True)
class Profile:
    """A simulated node (hardware and model profiles, each a shipped name or a YAML path), the objective its
    studies maximize, and the server's layout: `dp_size` replicas of `tp_size` GPUs (0: all the GPUs)."""

    key: str
    title: str
    hardware: str
    model: str
    objective: Path
    model_path: str
    draft_model_path: str
    tp_size: int = 0
    dp_size: int = 1

    @property
    def tp(self) -> int:
        """The study's --tp-size: the profile's, else every GPU of the node over the replicas."""
        return self.tp_size or load_hardware_profile(self.hardware).num_gpus // self.dp_size


PROFILES: Mapping[str, Profile] = {
    "seed": Profile(
        "seed",
        "seed profile: 8x RTX PRO 6000 (PCIe), Kimi-K2.5 INT4, 28k-token prompts x4",
        "rtx-pro-6000-pcie-x8",
        "kimi-k2.5-int4",
        REPO / "objectives" / "quickstart.yaml",
        "/models/Kimi-K2.5",
        "/models/Kimi-K2.5-EAGLE3",
    ),
    "h200": Profile(
        "h200",
        "H200 profile: 8x H200 (NVLink), Llama-70B BF16, 2k-token prompts x32",
        "h200-nvlink-x8",
        "llama-70b-bf16",
        BENCHMARKS / "objectives" / "h200-llama70b.yaml",
        "/models/Llama-3.1-70B-Instruct",
        "/models/Llama-3.1-70B-EAGLE3",
    ),
}


class ProfileFile(BaseModel):
    """A benchmark profile written as YAML (benchmarks/profiles/): paths are relative to the file."""

    model_config = ConfigDict(extra="forbid")

    title: str
    hardware: str = Field(description="a shipped hardware profile's name, or a YAML path")
    model: str = Field(description="a shipped model profile's name, or a YAML path")
    objective: str = Field(description="an objective YAML path")
    model_path: str
    draft_model_path: str
    tp_size: int = Field(default=0, ge=0, description="0: the node's GPUs over dp_size")
    dp_size: int = Field(default=1, ge=1, description="server replicas (--dp-size), each of tp_size GPUs")


def load_profile(name_or_path: str) -> Profile:
    """A shipped benchmark profile by name (seed: the calibration session's node and model, see
    docs/concepts.md; h200), or a profile YAML file by path."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise ConfigError(
            path,
            "",
            name_or_path,
            "neither a shipped profile nor a profile YAML file",
            f"Use one of {list(PROFILES)} or a path to a YAML file such as benchmarks/profiles/*.yaml.",
        )
    try:
        data = ProfileFile.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(path, field, err.get("input"), err["msg"], "Fix the profile field.") from exc

    def beside(value: str) -> str:  # a YAML path relative to the profile file; a shipped name as it is
        return str((path.parent / value).resolve()) if value.endswith((".yaml", ".yml")) else value

    profile = Profile(
        path.stem,
        data.title,
        beside(data.hardware),
        beside(data.model),
        Path(beside(data.objective)),
        data.model_path,
        data.draft_model_path,
        data.tp_size,
        data.dp_size,
    )
    gpus = load_hardware_profile(profile.hardware).num_gpus
    if profile.tp < 1 or profile.tp * profile.dp_size > gpus:
        raise ConfigError(
            path,
            "tp_size",
            data.tp_size,
            f"tp_size x dp_size ({profile.tp} x {profile.dp_size}) must fit the node's {gpus} GPUs",
            "Set tp_size and dp_size so that their product is at most num_gpus of the hardware profile.",
        )
    return profile


def search_space_for(profile: Profile) -> dict[str, Any]:
    """The shipped search space, its --ep-size choices made from the profile's --tp-size: expert parallelism
    splits the experts over the tensor-parallel ranks (SGLang asserts tp_size % ep_size == 0), so a
    single-GPU server has no --ep-size to search."""
    data = yaml.safe_load(SEARCH_SPACE.read_text())
    parameters = data["parameters"]
    if EP_SIZE in parameters:
        if profile.tp > 1:
            parameters[EP_SIZE] = {**parameters[EP_SIZE], "choices": [None, profile.tp]}
        else:
            del parameters[EP_SIZE]
    return cast(dict[str, Any], data)


def server_flags(profile: Profile) -> dict[str, int]:
    """The layout flags of every launch: --tp-size, and --dp-size when the server has replicas."""
    return {"--tp-size": profile.tp, **({"--dp-size": profile.dp_size} if profile.dp_size > 1 else {})}


def write_study(
    folder: Path,
    profile: Profile,
    n_trials: int,
    sampler: str = "tpe",
    seed: int = 0,
    nccl_stage: bool = True,
    trust: bool | Mapping[str, Any] = True,
    search_space: Mapping[str, Any] | None = None,
    node_hours: float | None = None,
    startup: Mapping[str, Any] | None = None,
) -> Study:
    """Write and load a study of the shipped search space (or `search_space`) on `profile`'s node, as a user
    would write it (the model's hidden size for the NCCL stage, which a real node reads from the model's
    config.json); `node_hours`: its budget in node hours beside the trials."""
    space = folder / "search_space.yaml"
    data = search_space_for(profile) if search_space is None else dict(search_space)
    space.write_text(yaml.safe_dump(data, sort_keys=False))
    data = {
        "study": f"bench-{profile.key}",
        "search_space": str(space),
        "objective": str(profile.objective),
        "server": {
            "command": ["python", "-m", "sglang.launch_server"],
            "model_path": profile.model_path,
            "draft_model_path": profile.draft_model_path,
            "flags": server_flags(profile),
        },
        "budget": {"n_trials": n_trials, **({"node_hours": node_hours} if node_hours is not None else {})},
        "sampler": {"name": sampler, "seed": seed},
        "nccl_stage": {"enabled": nccl_stage, "hidden_size": load_model_profile(profile.model).hidden_size},
        "trust": trust if isinstance(trust, bool) else dict(trust),  # True: the product's defaults
        **({"startup": dict(startup)} if startup is not None else {}),  # the study file's start-up section
    }
    return save_study(folder, data)


def write_sim_study(
    folder: Path,
    name: str,
    *,
    search_space: Path,
    objective: Path,
    n_trials: int,
    server: Mapping[str, Any],
    **sections: Any,
) -> Study:
    """Write and load a study whose trials launch the simulated SGLang server as real processes, serving
    the seed's model (Kimi-K2.5 INT4 with its EAGLE-3 draft, TP 8); `server` adds to the server section
    (port, env, flags) and `sections` are the file's other sections (sampler, timeouts, ray, nodes; `trust`
    is off unless given: these studies time the loop's machinery per trial, not the answer)."""
    data = {
        "study": name,
        "search_space": str(search_space),
        "objective": str(objective),
        "server": {
            "command": [sys.executable, "-m", "autotune.sim.sglang_server"],
            "model_path": "/models/Kimi-K2.5",
            "draft_model_path": "/models/Kimi-K2.5-EAGLE3",
            "flags": {"--tp-size": 8},
            **server,
        },
        "budget": {"n_trials": n_trials},
        "trust": False,
        **sections,
    }
    return save_study(folder, data)


def studies_in_pool(
    pool: Any, run: Callable[[JobT], DoneT], jobs: Sequence[JobT], started: float
) -> list[DoneT]:
    """`run` over `jobs` in a multiprocessing pool, in the order they finish, with the count done and the
    seconds since `started` on stderr: a full benchmark is hundreds of studies, minutes on two cores."""
    done: list[DoneT] = []
    for result in pool.imap_unordered(run, jobs):
        done.append(result)
        took = time.monotonic() - started
        print(f"\r{len(done)}/{len(jobs)} studies, {took:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    return done


def save_study(folder: Path, data: Mapping[str, Any]) -> Study:
    """Write a study file's `data` to `folder`/study.yaml and load it as autotune does."""
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return load_study(path)


class NodeClock(ModelNodeExecutor):
    """A model node that also adds up, per trial, the node time the trial would take: start-up until the
    server is ready or dies, plus the benchmark (until it ends or runs out of memory); the NCCL stage's
    all-reduce jobs (numbered in their own study) apart, in `stage_s`; every launch in `total_s`.

    With `noise` (autotune.sim.model.noise), a launch's draw is seeded by the request's seed shifted by
    `noise_seed` (the driver seeds a trial by its number, so every study would draw the same noise), and
    every `lease_every` trials run on the next lease of the machine (0: all on one)."""

    def __init__(
        self,
        node: str,
        hardware: HardwareProfile,
        model: ModelProfile,
        noise: SimNoise | float = 0.0,
        noise_seed: int = 0,
        lease_every: int = 0,
    ) -> None:
        super().__init__(node, hardware, model, noise)
        self.seconds: dict[int, float] = {}
        # Per launch: its start-up's seconds, and each benchmark of its plan as (load, seconds) in order.
        self.startup_s: dict[int, float] = {}
        self.steps: dict[int, tuple[tuple[float, float], ...]] = {}
        self.stage_s = 0.0
        self.total_s = 0.0
        self.spreads = SimNoise.of(noise)
        self.noise_seed = noise_seed
        self.lease_every = lease_every
        self.lease = 0  # set it to move every later launch to another lease
        self._launch: int | None = None  # the trial whose launch is running (a plan runs several benchmarks)
        self.before_stage: set[int] | None = None  # the launches made before the NCCL stage's first job

    def run(self, request: TrialRequest) -> TrialResult:
        if self._launch is not None:  # one benchmark of a launch's plan: its seed and lease are set
            return super().run(request)
        if request.job and self.before_stage is None:
            self.before_stage = set(self.seconds)
        self._launch = request.number
        try:
            lease = self.lease + (request.number // self.lease_every if self.lease_every else 0)
            self.noise = self.spreads.at_lease(1000 * self.noise_seed + lease)
            result = super().run(replace(request, seed=request.seed + 100_000 * self.noise_seed))
        finally:
            self._launch = None
        seconds = result.node_seconds or 0.0  # the product's count (TrialResult.node_seconds)
        self.total_s += seconds
        if request.job:
            self.stage_s += seconds
        else:
            self.seconds[request.number] = seconds
            self.startup_s[request.number] = result.startup_s or 0.0
            measured = result.benchmark
            levels = (measured.levels or (measured,)) if measured is not None else ()  # one level: itself
            self.steps[request.number] = tuple(
                (float(r.workload.request_rate or r.workload.concurrency), r.duration_s) for r in levels
            )
        return result

    def launch_seconds(self, numbers: Sequence[int]) -> list[float]:
        """The node seconds of the trials `numbers` (in the order they ran), the NCCL stage's counted with
        the first launch after it: the baseline runs before the stage, the search after."""
        seconds = [self.seconds.get(n, 0.0) for n in numbers]
        if seconds and self.stage_s:
            before = self.before_stage or set()
            after = [i for i, n in enumerate(numbers) if n not in before]
            seconds[after[0] if after else len(seconds) - 1] += self.stage_s
        return seconds


@dataclass(frozen=True)
class StudyRun:
    """One finished study, trial by trial in the order they ran, counting only trials that used the budget:
    the objective value (None for a failed or infeasible trial), node seconds, outcome and parameters."""

    values: list[float | None]
    node_s: list[float]
    states: list[str]
    params: list[Params]
    # The study's answer as `autotune best --json` gives it (autotune.study.trust.answer.study_answer):
    # confirmed or not, its value, gain and interval over SGLang's defaults, the noise estimate.
    answer: dict[str, Any] | None = None
    inspected: Any = None  # what run_study's `inspect` returned

    def best_after(self, k: int) -> float:
        """The best value among the first `k` trials (0 when none completed)."""
        return max((v for v in self.values[:k] if v is not None), default=0.0)

    def node_hours(self, k: int) -> float:
        return sum(self.node_s[:k]) / 3600

    def failed_node_hours(self, k: int) -> float:
        return sum(s for s, v in zip(self.node_s[:k], self.values[:k], strict=True) if v is None) / 3600


def run_study(
    profile: Profile,
    n_trials: int,
    *,
    sampler_name: str = "tpe",
    seed: int = 0,
    sampler: Callable[[Study], optuna.samplers.BaseSampler] | None = None,
    preflight: bool = True,
    remember_incompatible: bool = True,
    nccl_stage: bool = True,
    memory_edge: bool = True,
    trust: bool | Mapping[str, Any] = True,
    noise: SimNoise | float = 0.0,
    lease_every: int = 0,
    search_space: Mapping[str, Any] | None = None,
    inspect: Callable[[Study, optuna.Study, NodeClock, Callable[[int], optuna.Study]], Any] | None = None,
    node_hours: float | None = None,
    startup: Mapping[str, Any] | None = None,
) -> StudyRun:
    """Run one study of `n_trials` on one model node of `profile`: the named sampler of the product's
    registry (as a study file names it), or the sampler `sampler(study)` builds; `preflight` (with its
    `memory_edge`) and `remember_incompatible` turn the product's ways of not launching a failing config
    on or off, `nccl_stage` its NCCL all-reduce stage, whose node time counts with the first trial's;
    `trust` is the study file's section (True: the product's defaults; False: no baseline repeat, no
    confirmation, no stopping rule, every proposal launched). With `noise`, the node measures with
    run-to-run noise drawn from `seed` (NodeClock); `inspect(study, optuna_study, clock, rerun)` runs on the
    finished study before its files go, its answer kept in `inspected` (`rerun(total)` runs the trials it
    queued, as `autotune compare` does); `node_hours`: the study file's node-hour budget; `startup`: its
    start-up section."""
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    clock = NodeClock(NODE, hardware, model, noise, noise_seed=seed, lease_every=lease_every)

    def pool(_study: Study) -> NodePool:
        # With what the node check finds on such a node (GPUs, weights), as the product's pre-flight needs.
        return LocalNodePool({NODE: clock}, {NODE: node_report(NODE, hardware, model)})

    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        study = write_study(
            Path(folder),
            profile,
            n_trials,
            sampler_name,
            seed,
            nccl_stage,
            trust,
            search_space=search_space,
            node_hours=node_hours,
            startup=startup,
        )
        storage = optuna.storages.InMemoryStorage()
        driver = StudyDriver(
            study,
            pool=pool,
            sampler=sampler(study) if sampler is not None else None,
            storage=storage,
            preflight=preflight,
            remember_incompatible=remember_incompatible,
            memory_edge=memory_edge,
        )
        optuna_study = driver.run()

        def rerun(total: int) -> optuna.Study:  # the trials queued since, on the same node and storage
            return StudyDriver(study, pool=pool, storage=storage, queued_only=True).run(total)

        inspected = inspect(study, optuna_study, clock, rerun) if inspect is not None else None
    trials = sorted(optuna_study.get_trials(deepcopy=False), key=lambda t: t.number)
    used = [t for t in trials if t.state.is_finished() and counts(t)]
    return StudyRun(
        values=[_feasible_value(t) for t in used],
        node_s=clock.launch_seconds([t.number for t in used]),
        states=[t.state.name for t in used],
        params=[dict(t.params) for t in used],
        answer=answer.record() if (answer := study_answer(optuna_study)) is not None else None,
        inspected=inspected,
    )


def _feasible_value(trial: optuna.trial.FrozenTrial) -> float | None:
    if trial.state is not TrialState.COMPLETE or trial.value is None:
        return None
    return trial.value if is_feasible(trial) else None


# -- the landscape --------------------------------------------------------------------------------------


def parameter_values(space: SearchSpace, name: str) -> list[Any]:
    """Every value a parameter can take (a float range with a step is enumerated on its steps)."""
    parameter = space.parameters[name]
    if isinstance(parameter, IntParameter):
        return list(range(parameter.low, parameter.high + 1, parameter.step or 1))
    if isinstance(parameter, FloatParameter):
        if parameter.step is None:
            return [float(v) for v in np.linspace(parameter.low, parameter.high, 26)]
        count = round((parameter.high - parameter.low) / parameter.step)
        return [round(parameter.low + i * parameter.step, 10) for i in range(count + 1)]
    values = space.possible_values(name)
    assert values is not None  # categorical and bool parameters list their values
    return values


class Landscape:
    """The objective value of any config of a study's search space on `profile`'s model node, asked through
    the product's path (search space, server launch, model node); each distinct launch is asked once."""

    def __init__(self, profile: Profile, folder: Path, plan: MeasurementPlan | None = None) -> None:
        self.profile = profile
        self._plan = plan  # what a launch measures (a max_load truth: a finer load search); None: one run
        self.study = write_study(folder, profile, n_trials=1)
        self.space = self.study.search_space
        self.values = {name: parameter_values(self.space, name) for name in self.space}
        self.hardware = load_hardware_profile(profile.hardware)
        self.model = load_model_profile(profile.model)
        self._executor = ModelNodeExecutor(NODE, self.hardware, self.model)
        workload = self.study.objective.workload
        if workload is None:
            raise ValueError(
                f"a landscape needs a serving objective with a workload, but {profile.objective} has none"
            )
        self._workload = workload
        self._cache: dict[tuple[object, ...], float] = {}

    @property
    def evaluations(self) -> int:
        return len(self._cache)

    def value(self, params: Params) -> float:
        """The objective value of `params` (a value for every parameter; inactive ones are ignored), 0 when
        the launch fails or breaks a limit."""
        return self.value_of(self.space.suggest(optuna.trial.FixedTrial(params)))

    def value_of(self, config: TrialConfig) -> float:
        """The objective value of one trial's config (`space.baseline()` for SGLang's defaults)."""
        launch = self.study.server_launch(config)
        key = (launch.argv, tuple(sorted(launch.env.items())))
        if key not in self._cache:
            request = TrialRequest(0, launch, self._workload, 1.0, 1.0, plan=self._plan)
            result = self._executor.run(request).benchmark
            objective = self.study.objective
            ok = result is not None and within_limits(objective.constraints(result))
            self._cache[key] = objective.value(result) if ok else 0.0
        return self._cache[key]

    def active(self, params: Params) -> Params:
        """The parameters a trial with `params` would actually set (conditions and SGLang's rules applied)."""
        return dict(self.space.suggest(optuna.trial.FixedTrial(params)).params)

    def baseline_plan(self) -> MemoryPlan:
        """SGLang's own memory plan for the baseline launch (its automatic --mem-fraction-static, ...)."""
        argv = list(self.study.server_launch(self.space.baseline()).argv)
        flags = argv[argv.index("--model-path") :]
        return NodePerformanceModel(self.hardware, self.model, settings_for(flags, {})).plan

    def complete(self, params: Params) -> Params:
        """`params` with a value for every parameter: the default (unset or off) or the lowest value where
        it has none (inactive parameters are ignored, but a move that activates them needs them)."""
        filled = {}
        for name, values in self.values.items():
            default = next((v for v in (None, False) if any(v is c for c in values)), values[0])
            filled[name] = params.get(name, default)
        return filled

    def random_params(self, rng: random.Random, keep_default: float = 0.0) -> Params:
        """Random values; each parameter that has a default keeps it with probability `keep_default`."""
        defaults = self.complete({})
        return {
            name: defaults[name]
            if defaults[name] in (None, False) and rng.random() < keep_default
            else rng.choice(values)
            for name, values in self.values.items()
        }

    def blocks(self) -> list[list[str]]:
        """Parameters that only matter together: each parameter that a `when` names, with those it gates."""
        gated: dict[str, list[str]] = {}
        for name, parameter in self.space.parameters.items():
            for gate in parameter.when or {}:
                gated.setdefault(gate, [gate]).append(name)
        return list(gated.values())

    def ascend(self, params: Params) -> tuple[float, Params]:
        """Coordinate ascent: the best value of one parameter at a time, and of each block of parameters
        that only matter together (all their combinations), until nothing improves."""
        params = self.complete(params)
        best = self.value(params)
        moves = [[name] for name in self.values] + self.blocks()
        improved = True
        while improved:
            improved = False
            for names in moves:
                for combination in itertools.product(*(self.values[name] for name in names)):
                    trial = {**params, **dict(zip(names, combination, strict=True))}
                    value = self.value(trial)
                    if value > best * (1 + 1e-9):
                        best, params, improved = value, trial, True
        return best, params

    def search(
        self, samples: int, ascents: int, seed: int = 0, starts: Sequence[Params] = ()
    ) -> tuple[float, Params]:
        """The best config found by coordinate ascent from the `ascents` best of the baseline and `samples`
        random configs (half of them near the defaults), and from each of `starts`."""
        rng = random.Random(seed)
        candidates = [self.complete({})]
        candidates += [self.random_params(rng, keep_default=0.7 * (i % 2)) for i in range(samples)]
        scored = sorted(candidates, key=self.value, reverse=True)
        seen: set[tuple[tuple[str, str], ...]] = set()
        best: tuple[float, Params] = (self.value(scored[0]), scored[0])
        for params in [*itertools.islice(scored, ascents), *(self.complete(start) for start in starts)]:
            key = tuple(sorted((k, repr(v)) for k, v in self.active(params).items()))
            if key in seen:
                continue
            seen.add(key)
            found = self.ascend(params)
            if found[0] > best[0]:
                best = found
        return best[0], self.active(best[1])
