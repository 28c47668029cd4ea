"""Study files for tests, from one builder: a test names only what its study changes.

`study_data(**keys)` is a study file's contents: a study of Kimi-K2.5 on eight GPUs whose node the model
answers (`model_server()`: never launched), with the shipped search space, the quickstart objective and
autotune's TPE seeded 7; each keyword replaces or adds a top-level key, None leaves one out, `n_trials`
sets the budget. `simulated_server()` is a server section that launches the bundled simulated SGLang
server on this machine, and `e2e_study()` the small study of it that the end-to-end tests run.
`StudyFiles(folder)` (the `study_file` fixture, on the test's tmp_path) writes them; a search space or an
objective given as a mapping is written beside the study file and named relatively, as in a user's project.

`model_pool()` runs a study's trials on nodes the simulated node's model answers, at once and in this process.
`stored_trial()` and `study_of_trials()` write an Optuna study by hand, trial by trial, as the loop stores
one.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import Study
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import HardwareProfile, ModelProfile, load_hardware_profile, load_model_profile
from autotune.study.callbacks import KnobHeld, StudyCallback

REPO = Path(__file__).resolve().parents[1]
SHIPPED_SPACE = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
QUICKSTART_OBJECTIVE = REPO / "objectives" / "quickstart.yaml"
SIM_SERVER = [sys.executable, "-m", "autotune.sim.sglang_server"]
SEED_MODEL_PATH = "/models/Kimi-K2.5"
# The simulated server as the seed's node runs it (its default hardware: eight GPUs), flags to add after.
SIM_SEED_ARGV = (*SIM_SERVER, "--model-path", SEED_MODEL_PATH, "--tp-size", "8")
# The simulated server starts and serves in seconds: a trial stuck for a minute is a bug, not a slow node.
SIM_TIMEOUTS = {"startup_s": 60, "benchmark_s": 60}
# Where a mapping given for these keys is written, beside the study file.
_SIDE_FILES = {"search_space": "space.yaml", "objective": "objective.yaml"}


def model_server(**fields: Any) -> dict[str, Any]:
    """A server section for nodes the model answers: SGLang's own command, never launched here."""
    server = {
        "command": ["python", "-m", "sglang.launch_server"],
        "model_path": "/models/Kimi-K2.5",
        "draft_model_path": "/models/Kimi-K2.5-EAGLE3",
        "flags": {"--tp-size": 8},
    }
    return _changed(server, fields)


def simulated_server(*, env: Mapping[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """A server section that launches the simulated SGLang server at a thousandth of real time, on a port
    the node finds free at each launch (`port: auto`: a port picked when the file is written may be taken
    by another process by the time the study checks its node; `port=N` fixes one); `env` adds to (or
    replaces) its environment, `fields` replace its keys (None leaves one out)."""
    server = {
        "command": list(SIM_SERVER),
        "model_path": "/models/Kimi-K2.5",
        "port": "auto",
        "flags": {"--tp-size": 8},
        "env": {"SGLANG_SIM_TIME_SCALE": "0.001", **(env or {})},
    }
    return _changed(server, fields)


def small_objective(name: str = "small", *, num_prompts: int = 4, concurrency: int = 2) -> dict[str, Any]:
    """Output throughput on a few 2000-token prompts: a benchmark of the simulated server in a second."""
    workload = {"num_prompts": num_prompts, "input_len": 2000, "output_len": 64, "concurrency": concurrency}
    return {"name": name, "metric": "output_throughput", "workload": workload}


def max_load_objective(stop_below_best: bool = True) -> dict[str, Any]:
    """The highest request rate at which 90% of 8 short requests meet a loose SLO on the seed's node."""
    return {
        "name": "max-load",
        "metric": "max_load",
        "workload": {
            "num_prompts": 8,
            "input_len": 200,
            "output_len": 64,
            "concurrency": 8,
            "slo": {"ttft_ms": 1000, "tpot_ms": 200},
        },
        "load_search": {
            "start": 0.5, "max": 16, "min": 0.0625, "steps": 6, "stop_below_best": stop_below_best,
        },
    }  # fmt: skip


def study_data(*, n_trials: int | None = None, **keys: Any) -> dict[str, Any]:
    """A study file's contents: the model-answered study, with `keys` replacing or adding top-level keys
    (None leaves a key out) and `n_trials` as its budget."""
    data: dict[str, Any] = {
        "study": "t",
        "search_space": SHIPPED_SPACE,
        "objective": QUICKSTART_OBJECTIVE,
        "server": model_server(),
        "sampler": {"name": "tpe", "seed": 7},
        # Repeats, confirmation and the stopping rule change how many trials run: off unless a test is
        # about them (trust=None: the product's defaults; the end-to-end study keeps them on).
        "trust": False,
    }
    if n_trials is not None:
        if "budget" in keys:
            raise ValueError(
                f"give `n_trials` or `budget`, not both (got {n_trials=}, budget={keys['budget']})"
            )
        keys["budget"] = {"n_trials": n_trials}
    return _changed(data, keys)


def random_sim_study(
    name: str, space: Any, objective: Any, n_trials: int, *, seed: int, time_scale: float
) -> dict[str, Any]:
    """A study of the simulated server by random search seeded `seed`: serving at `time_scale` of real
    time, start-up at a thousandth, the simulated node's timeouts."""
    return study_data(
        study=name,
        search_space=space,
        objective=objective,
        server=simulated_server(
            env={"SGLANG_SIM_TIME_SCALE": str(time_scale), "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001"}
        ),
        n_trials=n_trials,
        sampler={"name": "random", "seed": seed},
        timeouts=SIM_TIMEOUTS,
    )


def e2e_study(n_trials: int = 6, **keys: Any) -> dict[str, Any]:
    """The small study run end to end on the simulated node (tests/conftest.py's `finished_study`): the
    shipped search space, the simulated nvidia-smi, a secret in the server's environment, TPE seeded 3."""
    nvidia_smi = [sys.executable, "-m", "autotune.sim.nvidia_smi"]
    server = simulated_server(
        draft_model_path="/models/Kimi-K2.5-EAGLE3",
        model_weight_gb=547,
        env={"HF_TOKEN": "hf_secret_value_123"},
    )
    return study_data(
        **{
            "study": "e2e",
            "objective": small_objective("small-throughput", num_prompts=6, concurrency=3),
            "nodes": [{"name": "local", "address": "local", "nvidia_smi": nvidia_smi}],
            "server": server,
            "n_trials": n_trials,
            "sampler": {"name": "tpe", "seed": 3},
            "timeouts": SIM_TIMEOUTS,
            **keys,
        }
    )


class StudyFiles:
    """Writes study files into one folder: `study_file(**keys)` writes `study_data(**keys)`,
    `study_file(data)` a study's contents as they are (a test that breaks a file on purpose)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(
        self, data: Mapping[str, Any] | None = None, /, *, file: str = "study.yaml", **keys: Any
    ) -> Path:
        if data is not None and keys:
            raise TypeError(f"give a study's contents or its keys, not both (got keys {sorted(keys)})")
        contents = dict(data if data is not None else study_data(**keys))
        path = self.folder / file
        path.parent.mkdir(parents=True, exist_ok=True)
        for key, name in _SIDE_FILES.items():
            if isinstance(contents.get(key), Mapping):
                (path.parent / name).write_text(yaml.safe_dump(dict(contents[key]), sort_keys=False))
                contents[key] = name
            elif isinstance(contents.get(key), Path):
                contents[key] = str(contents[key])
        path.write_text(yaml.safe_dump(contents, sort_keys=False))
        return path


def _changed(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied, keys changed to None left out."""
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


# -- studies run on the simulated node's model, in this process ---------------------------------------------
@functools.cache
def seed_node() -> tuple[HardwareProfile, ModelProfile]:
    """The seed's node (Kimi-K2.5 INT4 on eight RTX PRO 6000 over PCIe), its profiles read once a session
    (they are frozen)."""
    return load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")


class Said(StudyCallback):
    """What a study told its observers about the knobs it holds (`KnobHeld`), line by line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def knob_held(self, event: KnobHeld) -> None:
        self.lines.append(event.text)


def model_pool(nodes: int = 1, *, noise: float = 0.0, checked: bool = True) -> Callable[[Study], NodePool]:
    """`nodes` nodes (n0, n1, ...) answered by the model of the seed's node, with `noise` (relative SD) on
    every launch; `checked`: with what a node check would have found (GPUs, weights)."""
    hw, model = seed_node()
    names = [f"n{i}" for i in range(nodes)]
    facts = {name: node_report(name, hw, model) for name in names} if checked else {}
    return lambda study: LocalNodePool(
        {name: ModelNodeExecutor(name, hw, model, noise=noise) for name in names}, facts
    )


def launched(optuna_study: optuna.Study) -> list[FrozenTrial]:
    """The trials a node ran (not those answered without a launch)."""
    return [t for t in optuna_study.get_trials(deepcopy=False) if "node" in t.user_attrs]


def one_value_space(name: str, value: object) -> dict[str, object]:
    """A search space of one SGLang knob with one choice."""
    return {"parameters": {name: {"kind": "sglang", "type": "categorical", "choices": [value]}}}


# Every part of `trust` off, for a test to switch on the one it is about.
TRUST_OFF: dict[str, Any] = {
    "skip_same_launch": False,
    "repeat_baseline_after": 0,
    "confirm": False,
    "stop_early": False,
    "screen": False,
}
# Knobs the model's throughput does not depend on: a flat landscape, where only noise differs.
FLAT = {
    "parameters": {
        "--schedule-policy": {"kind": "sglang", "type": "categorical", "choices": [None, "lpm", "fcfs"]},
        "--stream-interval": {"kind": "sglang", "type": "categorical", "choices": [None, 2, 4, 16]},
    }
}


# -- Optuna studies written by hand -------------------------------------------------------------------------
def stored_trial(
    params: Mapping[str, Any] | None = None,
    value: float | None = 1.0,
    *,
    spaces: Mapping[str, BaseDistribution] | None = None,
    constraints: dict[str, float] | None = None,
    **attrs: Any,
) -> FrozenTrial:
    """A finished trial: COMPLETE with `value`, FAIL when it is None; each of `params` drawn from its
    distribution in `spaces` (by default a categorical of that one value); `attrs` its user attributes."""
    params = dict(params or {})
    spaces = spaces or {}
    distributions = {n: spaces.get(n) or CategoricalDistribution([v]) for n, v in params.items()}
    return create_trial(
        state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
        value=value,
        params=params,
        distributions=distributions,
        user_attrs=attrs,
        constraints=constraints,
    )


def study_of_trials(
    *trials: FrozenTrial,
    direction: Literal["maximize", "minimize"] = "maximize",
    storage: str | None = None,
    **attrs: Any,
) -> optuna.Study:
    """An Optuna study holding `trials` in order (in memory, or in `storage`), `attrs` its user attributes."""
    optuna_study = optuna.create_study(storage=storage, direction=direction)
    for name, value in attrs.items():
        optuna_study.set_user_attr(name, value)
    optuna_study.add_trials(trials)
    return optuna_study
