"""The NCCL all-reduce stage: a serving study's NCCL knobs tuned first, on all-reduces alone.

An all-reduce trial takes seconds and a server trial minutes, so a tensor-parallel study with NCCL knobs
tunes them first, by coordinate ascent on the all-reduces the server will make, and holds the best values
in every server trial. What it measures, and why: docs/design.md, "The NCCL stage".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study as OptunaStudy
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.config.objective import load_objective
from autotune.config.search_space import load_search_space
from autotune.config.study import JOB_COMMANDS, Budget, NcclStage, ServerSpec
from autotune.config.trust import Trust
from autotune.measure.client import Workload
from autotune.node.check import NodeReport
from autotune.node.pool import NodePool, Submitted
from autotune.study.records import TrialRecord
from autotune.study.rules import is_feasible
from autotune.trial.launch import TP_FLAGS, flag_value, to_env_value
from autotune.trial.wire import TrialRequest, TrialResult

STAGE_SUFFIX = ".nccl-stage"
STAGE_FOLDER = "nccl-stage"  # under the study's work dir: the stage's search space and objective files
CHUNK_FLAG = "--chunked-prefill-size"
BF16_BYTES = 2
Knobs = dict[str, list[Any]]  # an NCCL knob -> its values, in the search space's order
PointKey = tuple[tuple[str, str], ...]  # the env a point sets (knobs at NCCL's default left out)


def default_chunked_prefill_size(gpu_memory_gb: float) -> int:
    """SGLang 0.5.17's --chunked-prefill-size when unset, by the GPU's memory in MiB (server_args.py:4634-
    4690; the simulated server follows the same table)."""
    mib = gpu_memory_gb * 1e9 / (1 << 20)
    return 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else 8192 if mib < 160 * 1024 else 16384


def allreduce_messages(hidden_size: int, workload: Workload, chunk: int) -> dict[int, float]:
    """Bytes -> how many all-reduces of that size one request of `workload` costs (per layer: every forward
    pass all-reduces as often per layer, so the layers do not change the weights): a decode step's (its
    requests' tokens) per output token, and the prompt's prefill chunks."""
    token = hidden_size * BF16_BYTES
    requests = max(1, workload.concurrency)
    weights: dict[int, float] = {}

    def add(size: int, weight: float) -> None:
        if size > 0 and weight > 0:
            weights[size] = weights.get(size, 0.0) + weight

    add(token * requests, workload.output_len / requests)  # a step serves its requests together
    full, rest = divmod(workload.input_len, chunk)
    add(token * chunk, full)
    add(token * rest, 1)
    return weights


# The knobs that choose NCCL's transport between two GPUs: by default NCCL does not use P2P across PCIe host
# bridges, so GPUs behind different root ports go through host memory unless NCCL_P2P_LEVEL reaches them
# (shared/reference/nccl.md). Every other knob's best depends on the transport, and on such a node it is
# the knob that matters (4x L40S: 351.8 -> 265.1 us at SYS, no other knob past 1%), so they sweep first:
# a pass a node-hour budget cuts short has them.
TRANSPORT_KNOBS = ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")
# P2P levels at or above NVLink's own path type: GPUs that NVLink links pair by pair use P2P at each of them,
# as they do by default, so on such a node they cannot change the transport: not swept (the four of them
# were a pass's first jobs, all the 8x H200's budgeted stage ran).
NVLINK_P2P_LEVELS = ("NVL", "PIX", "PXB", "PHB", "NODE", "SYS")
# Then the knobs that set how many channels NCCL runs and how large their buffers are: they move both an
# all-reduce's time (every channel is polled on every operation) and the GPU memory NCCL takes from the KV
# cache (about 9 MiB per channel per peer; 1.43 -> 0.98 GiB at NCCL_MAX_NCHANNELS=1 on 2x H200,
# shared/reference/nccl.md). NCCL_ALGO and NCCL_PROTO sweep last: each forces one choice for every message
# size where NCCL's tuner picks one per size (within a node, rings; LL for decode's small messages).
# Measured under 2x auto_benchmark's node hours (16 seeds; benchmarks/RESULTS.md, first section): the
# H200 0.949 -> 0.981 of the best known, the 480B MoE coder 0.943 -> 0.987.
CHANNEL_KNOBS = ("NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE")
FORCING_KNOBS = ("NCCL_PROTO", "NCCL_ALGO")


def stage_knobs(study: Study, nvlink: bool = False) -> Knobs:
    """The search space's NCCL knobs the stage can sweep (those with listed values and no `when`) in the
    order their values matter: the transport's (TRANSPORT_KNOBS), the channels' (CHANNEL_KNOBS), the
    space's others in its order, those that force one choice for every message size (FORCING_KNOBS).
    `nvlink` (every pair of GPUs on NVLink): the P2P levels that cannot change the transport left out."""
    space = study.search_space
    knobs: Knobs = {}
    for name, parameter in space.parameters.items():
        if parameter.kind != "nccl" or parameter.when or not (values := space.possible_values(name)):
            continue
        if nvlink and name == "NCCL_P2P_LEVEL":  # held at NCCL's default where no other value is left
            values = [v for v in values if v not in NVLINK_P2P_LEVELS] or values
        knobs[name] = list(values)
    first = [name for name in (*TRANSPORT_KNOBS, *CHANNEL_KNOBS) if name in knobs]
    last = [name for name in FORCING_KNOBS if name in knobs]
    others = [name for name in knobs if name not in first and name not in last]
    return {name: knobs[name] for name in (*first, *others, *last)}


def tensor_parallel_size(study: Study) -> int:
    """The server's --tp-size as the study file sets it (SGLang's default: 1)."""
    return int(flag_value(study.file.server.flags.items(), *TP_FLAGS) or 1)


def hidden_size(study: Study) -> int | None:
    """The model's hidden size: the study file's `nccl_stage.hidden_size`, else model_path/config.json's
    (a multimodal model's text_config's) when the driver can read it; None otherwise."""
    if study.file.nccl_stage.hidden_size is not None:
        return study.file.nccl_stage.hidden_size
    model_path = study.file.server.model_path
    if model_path is None:
        return None
    try:
        config = json.loads((Path(model_path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        value = section.get("hidden_size") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def why_not(study: Study) -> str | None:
    """Why the study runs no NCCL stage; None when it runs one. A reason that starts with "skipped" is
    worth telling the user (the stage applies but cannot run)."""
    if not study.file.nccl_stage.enabled:
        return "off in the study file"
    if study.objective.is_job or study.objective.workload is None:
        return "not a serving objective"
    if not stage_knobs(study):
        return "no NCCL knobs with listed values in the search space"
    if tensor_parallel_size(study) < 2:
        return "one GPU in the tensor-parallel group"
    if hidden_size(study) is None:
        return (
            f"skipped: the model's hidden size is unknown ({study.file.server.model_path}/config.json is not "
            "readable here); set nccl_stage.hidden_size in the study file"
        )
    return None


# -- coordinate ascent ----------------------------------------------------------------------------------
def point_key(params: Mapping[str, Any]) -> PointKey:
    """The env a point sets: a knob at NCCL's default (None) sets nothing, so the baseline is all-None."""
    return tuple(sorted((name, to_env_value(value)) for name, value in params.items() if value is not None))


def ascent_size(knobs: Knobs) -> int:
    """Trials one pass takes: NCCL's defaults, then each knob's values other than its default."""
    return 1 + sum(sum(value is not None for value in values) for values in knobs.values())


def measured(trials: Sequence[FrozenTrial]) -> dict[PointKey, float]:
    """Each point's all-reduce time from the stage's trials: a completed, feasible trial's value; inf for a
    point whose trials all failed, or that is still running (a pending measurement is not the best)."""
    values: dict[PointKey, float] = {}
    for trial in trials:
        key = point_key(trial.params)
        ok = trial.state is TrialState.COMPLETE and trial.value is not None and is_feasible(trial)
        value = float(trial.value) if ok and trial.value is not None else math.inf
        if trial.state is TrialState.WAITING:
            continue  # queued again (an interrupted trial): not measured yet
        values[key] = min(values.get(key, math.inf), value)
    return values


def ascent(knobs: Knobs, values: Mapping[PointKey, float]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The next point to measure (None when the pass is done) and the best values so far: knob by knob in
    order, each knob's every value with the knobs before it at their best and those after at NCCL's
    default; a tie keeps the earlier value (the default first)."""
    best: dict[str, Any] = {name: None for name in knobs}
    for name, choices in knobs.items():
        for value in choices:
            point = {**best, name: value}
            if point_key(point) not in values:
                return point, best
        best[name] = min(choices, key=lambda value: values[point_key({**best, name: value})])
    return None, best


class CoordinateAscent(BaseSampler):
    """Proposes `ascent`'s next point from the study's trials; once the pass is done, its best again."""

    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self._points: dict[int, dict[str, Any]] = {}

    def _point(self, study: OptunaStudy, trial: FrozenTrial) -> dict[str, Any]:
        if trial.number not in self._points:
            others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
            point, best = ascent(self.knobs, measured(others))
            self._points = {trial.number: point if point is not None else best}
        return self._points[trial.number]

    def infer_relative_search_space(
        self, study: OptunaStudy, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: OptunaStudy, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self, study: OptunaStudy, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._point(study, trial).get(param_name)


# -- the stage's study ----------------------------------------------------------------------------------
def stage_study(
    study: Study,
    gpu_memory_gb: float | None,
    timeout_s: float | None,
    node_hours: float | None = None,
    *,
    nvlink: bool = False,
) -> Study:
    """The stage as a study of its own: the NCCL knobs, the all-reduce objective of the server's messages,
    the job on the study's nodes with the server's env, in the study's storage, within `timeout_s` and
    `node_hours` (its share of the study's). Its search space and objective are written to the study's
    work dir (MLflow logs them, and a resume compares them)."""
    knobs, tp, size = stage_knobs(study, nvlink), tensor_parallel_size(study), hidden_size(study)
    workload = study.objective.workload
    assert size is not None and workload is not None  # why_not(study) is None
    server = study.file.server
    if server.flags.get(CHUNK_FLAG) is not None:
        chunk = int(str(server.flags[CHUNK_FLAG]))
    else:
        chunk = default_chunked_prefill_size(gpu_memory_gb) if gpu_memory_gb else 8192
    if chunk < 0:  # -1: no chunking, the prompt is prefilled whole
        chunk = workload.input_len
    folder = study.workdir / STAGE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    space_path, objective_path = folder / "search_space.yaml", folder / "objective.yaml"
    written = yaml.safe_load(study.search_space_text)["parameters"]  # the knobs as the user wrote them
    parameters = {name: written[name] for name in knobs}
    space_path.write_text(yaml.safe_dump({"parameters": parameters}, sort_keys=False))
    messages = allreduce_messages(size, workload, chunk)
    objective = {
        "name": f"{study.objective.name}-nccl-stage",
        "kind": "nccl_allreduce",
        "metric": "allreduce_us",
        "allreduce": {
            "messages": {size_: round(weight, 6) for size_, weight in messages.items()},
            "gpus": tp,
        },
    }
    objective_path.write_text(
        f"# The all-reduces of {study.name}'s server: hidden size {size}, {workload.concurrency} requests a "
        f"decode step, prefill chunks of {chunk} tokens\n" + yaml.safe_dump(objective, sort_keys=False)
    )
    command = study.file.nccl_stage.command or list(JOB_COMMANDS["nccl_allreduce"])
    file = study.file.model_copy(  # nodes, never_launch, timeouts, ray as the study's
        update={
            "study": study.name + STAGE_SUFFIX,
            "search_space": str(space_path),
            "objective": str(objective_path),
            "storage": study.storage,
            "tracking_uri": study.tracking_uri,
            "server": ServerSpec(command=command, env=dict(server.env), host=server.host),
            "budget": Budget(n_trials=ascent_size(knobs), timeout_s=timeout_s, node_hours=node_hours),
            "nccl_stage": NcclStage(enabled=False),
            "trust": Trust.model_validate(False),  # a fixed coordinate ascent: no repeats nor confirmation
        }
    )
    return study.derived(
        file=file,
        search_space=load_search_space(space_path),
        objective=load_objective(objective_path),
        workdir=folder,
        search_space_path=space_path,
        objective_path=objective_path,
    )


@dataclass(frozen=True)
class StageResult:
    """What the stage found: the values to hold, the defaults' and the best's all-reduce time, the node
    seconds its trials took (as the node reported them), and why it ended before its pass was done."""

    held: dict[str, Any]
    baseline_us: float | None
    best_us: float | None
    trials: int
    node_s: float
    shortened: str | None = None  # e.g. "its share of the node-hour budget"; None: the whole pass ran
    unreached: tuple[str, ...] = ()  # the knobs a shortened pass did not reach: NCCL's defaults
    in_part: str | None = None  # the knob a shortened pass was sweeping: its best value measured so far

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> StageResult:
        """The stage a study recorded (`record`), as a resume holds it again."""
        return cls(
            dict(record.get("held") or {}),
            record.get("baseline_us"),
            record.get("best_us"),
            int(record.get("trials") or 0),
            float(record.get("node_s") or 0.0),
            record.get("shortened"),
            tuple(record.get("unreached") or ()),
            record.get("in_part"),
        )

    def record(self) -> dict[str, Any]:
        """What the study stores of its stage (records.NCCL_STAGE_ATTR), for its answer."""
        return {
            "held": self.held,
            "baseline_us": self.baseline_us,
            "best_us": self.best_us if self.best_us is not None and math.isfinite(self.best_us) else None,
            "trials": self.trials,
            "node_s": self.node_s,  # counted in the study's node hours (study.node_budget)
            "shortened": self.shortened,
            "unreached": list(self.unreached),
            "in_part": self.in_part,
        }

    def lines(self, name: str) -> list[str]:
        """What the console says: one summary line, then the knobs it changed."""
        gain = ""
        if self.baseline_us and self.best_us is not None and math.isfinite(self.best_us):
            gain = (
                f": allreduce_us {self.baseline_us:.1f} µs with NCCL's defaults, {self.best_us:.1f} µs with "
                f"its best ({(self.best_us - self.baseline_us) / self.baseline_us:+.0%})"
            )
        changed = {n: v for n, v in self.held.items() if v is not None}
        kept = [n for n, v in self.held.items() if v is None and n not in (*self.unreached, self.in_part)]
        cut = f", cut short by {self.shortened}" if self.shortened else ""
        lines = [
            f"NCCL stage {name}: {self.trials} all-reduce trials{cut}, {self.node_s:.0f} s on the node{gain}"
        ]
        lines += [f"NCCL stage: {n}={v} held in every server trial" for n, v in changed.items()]
        if kept:
            lines.append(f"NCCL stage: {', '.join(kept)} held at NCCL's defaults")
        if self.in_part:
            lines.append(f"NCCL stage: {self.in_part} swept in part, its best value measured held")
        if self.unreached:
            lines.append(f"NCCL stage: {', '.join(self.unreached)} not reached, held at NCCL's defaults")
        return lines


def stage_result(
    knobs: Knobs, trials: Sequence[FrozenTrial], shortened: str | None = None
) -> StageResult | None:
    """The finished stage's result, from its trials; None while its pass is not done, unless it was
    `shortened` (why): then it holds its best point measured, the knobs it swept whole at their best and
    the one it was sweeping at its best value so far (a pass a budget cuts short after MAX_NCHANNELS 1, 2,
    4 and 8 holds the best of them), the rest at NCCL's defaults."""
    values = measured(trials)
    point, best = ascent(knobs, values)
    if point is not None and shortened is None:
        return None
    in_part: str | None = None
    unreached: tuple[str, ...] = ()
    if point is not None:
        names = list(knobs)  # the knob the pass was sweeping differs from its best in the next point
        current = next((n for n in names if point.get(n) != best.get(n)), names[0])
        unreached = tuple(names[names.index(current) + 1 :])
        times = {v: values[key] for v in knobs[current] if (key := point_key({**best, current: v})) in values}
        if any(v is not None for v in times):
            in_part = current
            best = {**best, current: min(times, key=lambda v: times[v])}  # a tie keeps the earlier value
        else:
            unreached = (current, *unreached)
    baseline = values.get(())
    best_us = values.get(point_key(best))
    node_s = math.fsum(TrialRecord.of(t).node_s or 0.0 for t in trials)
    if best_us is None or not math.isfinite(best_us):
        best = {}  # nothing completed: hold nothing
    cut = shortened if point is not None else None
    return StageResult(best, baseline, best_us, len(trials), node_s, cut, unreached, in_part)


def stage_trials(study: Study, storage: optuna.storages.BaseStorage | str) -> list[FrozenTrial]:
    """The trials of `study`'s stage so far ([] before it ran)."""
    try:
        optuna_study = optuna.load_study(study_name=study.name + STAGE_SUFFIX, storage=storage)
    except KeyError:
        return []
    return optuna_study.get_trials(deepcopy=False)


def finished_stage(
    study: Study, storage: optuna.storages.BaseStorage | str, nvlink: bool = False
) -> StageResult | None:
    """The stage's result when its Optuna study exists and its pass is done (a resume reuses it)."""
    return stage_result(stage_knobs(study, nvlink), stage_trials(study, storage))


class LentPool(NodePool):
    """The study's node pool, lent to the stage's driver: its close leaves the pool to its owner, and its
    trials' logs go to a folder of their own in each node's folder (`log_folder`), since the stage's trial
    numbers are the study's too."""

    def __init__(self, pool: NodePool, log_folder: str = STAGE_FOLDER) -> None:
        self.pool = pool
        self.log_folder = log_folder

    def idle_nodes(self) -> list[str]:
        return self.pool.idle_nodes()

    def submit(self, node: str, request: TrialRequest) -> Submitted:
        return self.pool.submit(node, replace(request, log_folder=self.log_folder))

    def wait(self, timeout_s: float) -> list[tuple[Submitted, TrialResult]]:
        return self.pool.wait(timeout_s)

    def phase(self, submitted: Submitted) -> str | None:
        return self.pool.phase(submitted)

    def abort_all(self) -> None:
        self.pool.abort_all()

    def close(self) -> None:
        """The owner closes it."""

    def facts(self, node: str) -> NodeReport | None:
        return self.pool.facts(node)


def smallest_gpu_gb(pool: NodePool) -> float | None:
    """The smallest GPU memory among the pool's idle nodes, as their node checks found it."""
    sizes = [f.gpu_memory_gb for n in pool.idle_nodes() if (f := pool.facts(n)) and f.gpu_memory_gb]
    return min(sizes) if sizes else None
