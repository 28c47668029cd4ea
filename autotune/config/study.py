"""The study file: the model, the node(s), the search space, the objective, storage and limits.

`load_study` validates the study file and the files it names, checks them against each other, and returns
a `Study`. Loading creates nothing on disk; whoever runs the study calls `Study.ensure_workdir()`.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.config._yaml import (
    config_error_from_validation,
    expand_env_references,
    load_yaml,
    rule_error,
    switch_or_section,
)
from autotune.config.hosts import AddressError, is_loopback, parse_ssh_address
from autotune.config.objective import InFlight, Objective, load_objective
from autotune.config.search_space import (
    FLAG_NAME,
    MANAGED_FLAGS,
    BoolParameter,
    CategoricalParameter,
    SearchSpace,
    SpeculativeRules,
    load_search_space,
)
from autotune.config.startup import Startup
from autotune.config.trust import Trust
from autotune.dialect import Dialect, FlagTable, all_committed_tables, unknown_flag
from autotune.errors import ConfigError, did_you_mean
from autotune.trial.launch import (
    AUTO_PORT,
    DP_FLAGS,
    ServerLaunch,
    TrialConfig,
    build_server_launch,
    check_never_launch,
    flag_value,
    is_env_name,
    to_arg,
    to_env_value,
)
from autotune.trial.redaction import Secrets
from autotune.trial.startup import multithread_loading_flag

STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
WORKDIR_NAME = ".autotune"
# The simulated node's server module, and the variable that seeds its run-to-run noise.
SIMULATED_SERVER = "autotune.sim.sglang_server"
SIM_SEED_VAR = "SGLANG_SIM_SEED"


def is_simulated(command: Sequence[str]) -> bool:
    """Whether `command` starts the simulated SGLang node rather than SGLang."""
    return SIMULATED_SERVER in command


# Both switch NVLink multicast (NVLS) on, which must stay off where the fabric cannot take it.
DEFAULT_NEVER_LAUNCH_ENV: Mapping[str, tuple[str, ...]] = {"NCCL_NVLS_ENABLE": ("1", "2")}
DEFAULT_NEVER_LAUNCH_FLAGS: tuple[str, ...] = ("--enable-nccl-nvls", "--enable-symm-mem")
# The command a job objective's trial runs when `server.command` is not set (python3: the node's Python).
JOB_COMMANDS: Mapping[str, tuple[str, ...]] = {"nccl_allreduce": ("python3", "-m", "autotune.measure.nccl")}

# The samplers a study file may name; autotune.study.samplers.SAMPLERS builds each (a test checks they agree).
SAMPLER_NAMES: tuple[str, ...] = ("tpe", "tpe-plain", "random", "gp", "nsga2")

PositiveFloat = Annotated[float, Field(gt=0)]


SSH_ONLY_FIELDS = ("key_file", "known_hosts", "accept_unknown_host_key", "remote_dir", "connect_timeout_s")


class NodeSpec(BaseModel):
    """A GPU node that runs trials: `local` (the actor runs on it) or `ssh://user@host:port`.

    For SSH: `key_file` logs in, `known_hosts` holds the node's host key (an unknown key is refused
    unless `accept_unknown_host_key`), `remote_dir` holds the logs on the node (relative to the login's
    home). `benchmark_from: node` runs the benchmark on the node, for a port the driver cannot reach.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1)]
    address: str = "local"
    key_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    accept_unknown_host_key: bool = False
    benchmark_from: Literal["driver", "node"] = "driver"
    remote_dir: Annotated[str, Field(min_length=1)] = ".autotune"
    connect_timeout_s: PositiveFloat = 10.0
    # The command that answers nvidia-smi's GPU query there ([python, -m, autotune.sim.nvidia_smi] for the
    # simulated node): GPU inventory, memory and driver, for the node check and the hardware fingerprint.
    nvidia_smi: list[str] = Field(default_factory=lambda: ["nvidia-smi"], min_length=1)

    @field_validator("address")
    @classmethod
    def _supported(cls, address: str) -> str:
        if address == "local":
            return address
        if address.startswith("ssh:"):
            try:
                parse_ssh_address(address)
            except AddressError as exc:
                raise rule_error(exc.problem, value=address, fix=exc.fix) from None
            return address
        raise rule_error("unknown node address", value=address, fix="Use `local` or `ssh://user@host:port`.")

    @model_validator(mode="after")
    def _ssh_fields_need_ssh(self) -> NodeSpec:
        if self.address == "local":
            for name in (f for f in SSH_ONLY_FIELDS if f in self.model_fields_set):
                raise rule_error(
                    f"{name} only applies to an ssh:// node",
                    loc=(name,),
                    value=getattr(self, name),
                    fix=f"Remove {name}, or set address: ssh://user@host:port.",
                )
        return self

    @property
    def is_ssh(self) -> bool:
        return self.address != "local"


class ServerSpec(BaseModel):
    """How to start SGLang: the command, the model, where it listens, and fixed base flags and env.

    For a job objective (`kind: nccl_allreduce`) no server runs: `command` is the job (by default
    `JOB_COMMANDS[kind]`) and `env` its base environment; there is no model, and no flags.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(default_factory=lambda: ["python", "-m", "sglang.launch_server"])
    model_path: Annotated[str, Field(min_length=1)] | None = None  # required for a serving objective
    draft_model_path: str | None = None
    # The weights' size in GB for the pre-flight memory check; unset: the node check sums the
    # safetensors under model_path there (and a path it cannot read turns the check off).
    model_weight_gb: Annotated[float, Field(gt=0)] | None = None
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    # "auto": the node picks a free port for each launch (several servers on one machine, e.g. tests).
    port: int | Literal["auto"] = 30000
    flags: dict[str, str | None] = Field(default_factory=dict)  # None: a switch without a value
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        """Whether `command` starts the simulated SGLang node rather than SGLang."""
        return is_simulated(self.command)

    @property
    def model_folders(self) -> dict[str, str]:
        """The folders SGLang loads on the node, by field: the model's and the draft's (none for the
        simulated node, which reads no weights)."""
        if self.simulated:
            return {}
        named = {"server.model_path": self.model_path, "server.draft_model_path": self.draft_model_path}
        return {field: path for field, path in named.items() if path}

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, port: Any) -> Any:
        if port == "auto" or (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535):
            return port
        raise rule_error(
            "must be a whole number from 1 to 65535, or 'auto'",
            value=port,
            fix="Use e.g. 30000, or auto to let the node pick a free port for each launch.",
        )

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, command: Any) -> Any:
        if isinstance(command, str):
            try:
                return shlex.split(command)
            except ValueError as exc:
                raise rule_error(
                    f"cannot split the command ({exc})", value=command, fix="Balance the quotes."
                ) from None
        return command

    @field_validator("command")
    @classmethod
    def _not_empty(cls, command: list[str]) -> list[str]:
        if not command:
            raise rule_error(
                "the command is empty", value=command, fix="Use e.g. [python, -m, sglang.launch_server]."
            )
        return command

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_values(cls, flags: Any) -> Any:
        if not isinstance(flags, dict):
            return flags
        # true or null: a switch; false: left out; numbers become their command-line text.
        return {
            flag: None if value is None or value is True else to_arg(value) if _scalar(value) else value
            for flag, value in flags.items()
            if value is not False
        }

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, flags: dict[str, str | None]) -> dict[str, str | None]:
        for flag in flags:
            _check_flag_name(flag, (flag,), "a server flag", "; env vars go under server.env")
            if flag in MANAGED_FLAGS:
                raise rule_error(
                    f"{flag} is set by autotune",
                    loc=(flag,),
                    value=flag,
                    fix=f"Remove it here and set `{MANAGED_FLAGS[flag]}`.",
                )
        return flags

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, env: Any) -> Any:
        if not isinstance(env, dict):
            return env
        return {name: to_env_value(value) if _scalar(value) else value for name, value in env.items()}

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        _check_env_names(env)
        return env


class Budget(BaseModel):
    """When the study stops: after `n_trials` trials, `timeout_s` seconds or `node_hours` of the node's
    time (start-up, benchmark and failed launches alike; the confirmation's cost kept back: study.budget),
    whichever comes first. With `node_hours` alone, the trial count does not bound the search."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_trials: Annotated[StrictInt, Field(gt=0)] | None = 20
    timeout_s: PositiveFloat | None = None
    node_hours: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _hours_alone(cls, data: Any) -> Any:
        # `budget: {node_hours: H}` means H hours, not H hours or the default 20 trials, whichever first.
        if isinstance(data, dict) and data.get("node_hours") is not None and "n_trials" not in data:
            return {**data, "n_trials": None}
        return data

    @field_validator("node_hours")
    @classmethod
    def _positive_hours(cls, hours: float | None) -> float | None:
        if hours is not None and not (hours > 0 and math.isfinite(hours)):
            raise rule_error(
                "a node-hour budget must be a positive number of hours",
                value=hours,
                fix="Set node_hours to e.g. 2.0 (two hours of the node's time), or remove it.",
            )
        return hours

    @model_validator(mode="after")
    def _bounded(self) -> Budget:
        if self.n_trials is None and self.timeout_s is None and self.node_hours is None:
            raise rule_error(
                "the study would never stop",
                loc=("n_trials",),
                value=None,
                fix="Set n_trials or timeout_s (or node_hours: a budget in node hours).",
            )
        return self


class SamplerSpec(BaseModel):
    """Which Optuna sampler proposes trials (`autotune.study.samplers.build` makes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "tpe"
    seed: StrictInt | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in SAMPLER_NAMES:
            hint = did_you_mean(name, SAMPLER_NAMES).strip()
            raise rule_error(
                "unknown sampler", value=name, fix=f"{hint} Samplers: {', '.join(SAMPLER_NAMES)}.".strip()
            )
        if name == "gp" and importlib.util.find_spec("torch") is None:
            # Optuna imports it at the first proposal after the start: fail now, not trials into a study.
            raise rule_error(
                "sampler gp needs PyTorch, which is not installed here",
                value=name,
                fix="Install it (pip install torch; the CPU build is enough) or use sampler tpe.",
            )
        return name


class Timeouts(BaseModel):
    """How long a server may take to become ready, and a benchmark to finish."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    startup_s: PositiveFloat = 1800.0
    benchmark_s: PositiveFloat = 900.0


class NeverLaunch(BaseModel):
    """Env values and flags no launch may use; the defaults keep NVLink multicast off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: dict[str, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_NEVER_LAUNCH_ENV.items()}
    )
    flags: list[str] = Field(default_factory=lambda: list(DEFAULT_NEVER_LAUNCH_FLAGS))

    @field_validator("env", mode="before")
    @classmethod
    def _as_strings(cls, env: Any) -> Any:
        if not isinstance(env, dict):
            return env
        out = {}
        for name, values in env.items():
            values = values if isinstance(values, list) else [values]
            out[name] = [to_env_value(v) if _scalar(v) and v is not None else v for v in values]
        return out

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, list[str]]) -> dict[str, list[str]]:
        _check_env_names(env)
        return env

    @field_validator("flags")
    @classmethod
    def _flag_names(cls, flags: list[str]) -> list[str]:
        for index, flag in enumerate(flags):
            _check_flag_name(flag, (index,), "a flag")
        return flags


class Failures(BaseModel):
    """How failed trials are scored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    oom_penalty: float = Field(
        default=0.0, description="the value an out-of-memory trial records (it is PRUNED, not COMPLETE)"
    )


class RaySpec(BaseModel):
    """The Ray cluster trials run on: a local runtime by default, or an existing cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = Field(
        default=None, description="ray://host:10001 or host:6379 of an existing cluster (or set RAY_ADDRESS)"
    )
    discover_nodes: bool = Field(
        default=False,
        description="one node per `gpu_node` resource in the cluster, each running trials locally; "
        "`nodes` then holds the one template they share",
    )
    require_hardware: str | None = Field(
        default=None,
        description="use only nodes whose hardware fingerprint contains this text, e.g. '8x NVIDIA H200'",
    )


class NcclStage(BaseModel):
    """The NCCL all-reduce stage a serving study runs first (autotune.study.stages): the search space's NCCL
    knobs tuned on the all-reduces the server will do, seconds a trial, their best held in the server
    trials. It applies when the space has NCCL knobs and --tp-size is above 1; `nccl_stage: off` skips it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: StrictBool = True
    # The job each stage trial runs; unset: JOB_COMMANDS["nccl_allreduce"] (python3 -m autotune.measure.nccl).
    command: Annotated[list[str], Field(min_length=1)] | None = None
    # The model's hidden size (the all-reduced rows' width); unset: `hidden_size` of model_path/config.json.
    hidden_size: Annotated[StrictInt, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        # `nccl_stage: off` (YAML reads off/false as False) or `on`: the switch alone.
        fix = "Use `nccl_stage: off` to skip the NCCL stage, or a section: `nccl_stage: {hidden_size: 7168}`."
        return switch_or_section(value, fix)


class StudyFile(BaseModel):
    """The schema of a study YAML file. Paths are relative to the study file's folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    study: str
    search_space: Annotated[str, Field(min_length=1)]
    objective: Annotated[str, Field(min_length=1)]
    storage: str | None = None
    tracking_uri: str | None = None
    nodes: list[NodeSpec] = Field(default_factory=lambda: [NodeSpec(name="local", address="local")])
    server: ServerSpec
    budget: Budget = Field(default_factory=Budget)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    never_launch: NeverLaunch = Field(default_factory=NeverLaunch)
    failures: Failures = Field(default_factory=Failures)
    ray: RaySpec = Field(default_factory=RaySpec)
    nccl_stage: NcclStage = Field(default_factory=NcclStage)
    trust: Trust = Field(default_factory=Trust)  # autotune.config.trust
    startup: Startup = Field(default_factory=Startup)  # autotune.config.startup

    @field_validator("study")
    @classmethod
    def _name(cls, name: str) -> str:
        if not STUDY_NAME.match(name):
            raise rule_error(
                "a study name must match ^[A-Za-z0-9][A-Za-z0-9_.-]*$ (it names a folder)",
                value=name,
                fix="Use letters, digits, '_', '.' and '-', e.g. kimi-k2-eagle3.",
            )
        return name

    @model_validator(mode="after")
    def _one_template_when_discovering(self) -> StudyFile:
        if self.ray.discover_nodes and (len(self.nodes) != 1 or self.nodes[0].address != "local"):
            raise rule_error(
                "with ray.discover_nodes, `nodes` is the one template every discovered node uses",
                loc=("nodes",),
                value=[node.name for node in self.nodes],
                fix="Keep a single `{name: gpu, address: local}` entry: each node runs its trials itself.",
            )
        return self

    @field_validator("nodes")
    @classmethod
    def _unique_nodes(cls, nodes: list[NodeSpec]) -> list[NodeSpec]:
        if not nodes:
            raise rule_error(
                "a study needs at least one node", value=nodes, fix="Use [{name: local, address: local}]."
            )
        names = [node.name for node in nodes]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise rule_error(
                    "node names must be unique", loc=(index, "name"), value=name, fix="Rename one of them."
                )
        return nodes


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _check_flag_name(flag: str, loc: tuple[str | int, ...], what: str, note: str = "") -> None:
    """Every flag the study file lists (server flags, flags never to launch) is written with its '--'."""
    if not FLAG_NAME.match(flag):
        raise rule_error(
            f"{what} must start with '--'", loc=loc, value=flag, fix=f"Write '--{flag.lstrip('-')}'{note}."
        )


def _check_env_names(env: Mapping[str, object]) -> None:
    for name in env:
        if not is_env_name(name):
            raise rule_error(
                "not a valid environment variable name",
                loc=(name,),
                value=name,
                fix="Use letters, digits and '_', not starting with a digit.",
            )


@dataclass(frozen=True)
class Study:
    """A loaded study: the validated study file, its search space and objective, and resolved locations."""

    file: StudyFile
    path: Path
    search_space: SearchSpace
    objective: Objective
    storage: str
    tracking_uri: str
    workdir: Path
    search_space_path: Path
    objective_path: Path
    env_references: tuple[str, ...] = ()  # the `${NAME}`s the study file reads from the environment
    # Those not set where it was loaded for a command that launches nothing (`load_study(for_launch=False)`):
    # each one's error, raised by `check_launchable` when trials are to run.
    unset_env: tuple[ConfigError, ...] = ()
    # The study this one was derived from (`derived`: the NCCL stage's is the server study): its secrets
    # are this one's too, since this one's `path` is still that study's file.
    derived_from: Study | None = None

    @property
    def name(self) -> str:
        return self.file.study

    @property
    def secrets(self) -> Secrets:
        """What nothing the study writes may hold in clear: the values of its `${NAME}`s, of its secret
        flags and env vars, and of the secret-named vars of the environment it runs in."""
        server = self.file.server
        unset = {error.value for error in self.unset_env}  # still `${NAME}` as written: no value to hide
        flags = {f: v for f, v in server.flags.items() if v not in unset}
        env = {k: v for k, v in server.env.items() if v not in unset}
        referenced = [os.environ[name] for name in self.env_references if name in os.environ]
        own = Secrets.of(
            env={**os.environ, **env}, argv=server.command, flags=flags.items(), values=referenced
        )
        return own if self.derived_from is None else own | self.derived_from.secrets

    def check_flags(self, node_tables: Sequence[FlagTable] = ()) -> None:
        """Raise ConfigError for the first flag of the search space that no SGLang version autotune knows
        takes: the committed flag tables, and `node_tables` (the nodes' own, once the node check read
        them). A flag only some versions have passes: the node's dialect holds it with a notice."""
        tables = [*all_committed_tables(), *node_tables]
        for name, parameter in self.search_space.parameters.items():
            if parameter.kind == "nccl" or (unknown := unknown_flag(name, tables)) is None:
                continue
            problem, hint = unknown
            raise ConfigError(
                self.search_space_path,
                f"parameters.{name}",
                name,
                problem,
                (hint or "Check it against the server's `--help`.")
                + " (A newer SGLang's own flag: add that version's table, scripts/dump_sglang_flags.py.)",
            )

    def derived(self, **changes: Any) -> Study:
        """A study autotune creates for itself from this one (the NCCL stage): `changes` replace fields,
        and whatever it writes hides this study's secrets as well as its own (`secrets`)."""
        return replace(self, derived_from=self, **changes)

    @property
    def tree_algorithms(self) -> tuple[str, ...]:
        """The speculative algorithms with a draft tree that the search space offers, in its order."""
        algorithm = self.search_space.parameters.get(SpeculativeRules.ALGORITHM)
        if not isinstance(algorithm, CategoricalParameter):
            return ()
        return tuple(c for c in algorithm.choices if SpeculativeRules.has_tree(c))

    def in_flight(self, params: Mapping[str, Any] | None = None) -> InFlight | None:
        """The requests each server replica holds at once for the objective's workload: their share over
        the --dp-size a trial's `params` set, else the server section (Objective.in_flight)."""
        searched = [(name, str(value)) for name, value in (params or {}).items() if value is not None]
        dp = flag_value(searched, *DP_FLAGS) or flag_value(self.file.server.flags.items(), *DP_FLAGS) or "1"
        return self.objective.in_flight(int(dp)) if dp.isdigit() and int(dp) > 0 else None

    @property
    def search_space_text(self) -> str:
        return self.search_space_path.read_text()

    @property
    def objective_text(self) -> str:
        return self.objective_path.read_text()

    def ensure_workdir(self) -> Path:
        """Create the study's work dir (`<study dir>/.autotune/<study>/`) if needed and return it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir

    def server_launch(
        self, config: TrialConfig, port: int | None = None, dialect: Dialect | None = None
    ) -> ServerLaunch:
        """The server launch for one trial (or `search_space.baseline()`); `port` overrides the file's;
        `dialect` spells the flags as the node's SGLang version takes them.

        Raises ForbiddenLaunchError when the launch would use a never_launch value.
        """
        if self.objective.is_job:
            return self.job_launch(config)
        server = self.file.server
        if server.model_path is None:  # load_study refuses this for a serving objective
            raise ConfigError(self.path, "server.model_path", None, "missing", "Set server.model_path.")
        algorithm = config.flags.get(SpeculativeRules.ALGORITHM) or server.flags.get(
            SpeculativeRules.ALGORITHM
        )
        draft = server.draft_model_path if SpeculativeRules.needs_draft_model(algorithm) else None
        startup, set_flags = self.file.startup, {**server.flags, **config.flags}
        loader = (
            multithread_loading_flag(set_flags, dialect, startup.weight_loading_threads)
            if startup.multithread_weight_loading
            else {}
        )
        launch = build_server_launch(
            command=server.command,
            model_path=server.model_path,
            config=config,
            host=server.host,
            port=(AUTO_PORT if server.port == "auto" else server.port) if port is None else port,
            base_flags={**server.flags, **loader},
            base_env=server.env,
            draft_model_path=draft,
            never_launch_env=self.file.never_launch.env,
            never_launch_flags=self.file.never_launch.flags,
            dialect=dialect,
        )
        return replace(launch, secrets=self.secrets)

    def seeded(self, launch: ServerLaunch, trial: int) -> ServerLaunch:
        """`launch` with the simulated node's noise seeded from the study's seed and the trial number
        (`SGLANG_SIM_SEED`), so that a seeded simulated study measures the same on a rerun; unchanged for a
        real server (its noise is the hardware's), an unseeded study, or a seed server.env sets itself."""
        seed = self.file.sampler.seed
        if seed is None or not self.file.server.simulated or SIM_SEED_VAR in launch.env:
            return launch
        return replace(launch, env={**launch.env, SIM_SEED_VAR: str((seed * 1_000_003 + trial) % 2**31)})

    def check_launchable(self) -> None:
        """Raise the error of the first `${NAME}` of the study file that is not set (only a study loaded
        for a command that launches nothing has one): running trials needs every value."""
        if self.unset_env:
            raise self.unset_env[0]

    def job_launch(self, config: TrialConfig) -> ServerLaunch:
        """The launch of one trial's job: the job command with the objective's arguments, and the study's
        env with the trial's on top. Raises ForbiddenLaunchError for a never_launch value."""
        server, objective = self.file.server, self.objective
        if objective.allreduce is None:  # the only job kind so far; check_kind makes sure it is set
            raise ValueError(f"`allreduce` must be set for a job launch, but {objective.name!r} has none.")
        command = server.command if "command" in server.model_fields_set else JOB_COMMANDS[objective.kind]
        launch = ServerLaunch(
            command=tuple(command),
            flags=objective.allreduce.settings().flags(),
            env={**server.env, **config.env},
            host=server.host,
            port=AUTO_PORT,  # a job listens nowhere
            secrets=self.secrets,
        )
        check_never_launch(launch, env=self.file.never_launch.env, flags=self.file.never_launch.flags)
        return launch


def load_study(path: Path | str, *, for_launch: bool = True) -> Study:
    """Read and validate a study file and the files it names; creates nothing on disk.

    A `${NAME}` that is not set is an error, unless `for_launch` is False (a command that launches no
    server: status, best, report, ...): it then stays as written, and a launch raises its error.
    """
    path = Path(path)
    unset: list[ConfigError] | None = None if for_launch else []
    data, env_references = expand_env_references(path, load_yaml(path), unset=unset)
    try:
        file = StudyFile.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(path, exc, StudyFile) from None
    study_dir = path.expanduser().resolve().parent
    search_space_path = _named_file(path, study_dir, "search_space", file.search_space)
    objective_path = _named_file(path, study_dir, "objective", file.objective)
    search_space = load_search_space(search_space_path)
    objective = load_objective(objective_path)
    _check_objective_kind(path, file, objective, search_space)
    _check_against_search_space(path, file, search_space)
    file = _resolve_node_files(path, file, study_dir)
    workdir = study_dir / WORKDIR_NAME / file.study
    return Study(
        file=file,
        path=path,
        search_space=search_space,
        objective=objective,
        storage=file.storage or f"sqlite:///{workdir / 'optuna.db'}",
        tracking_uri=file.tracking_uri or f"sqlite:///{workdir / 'mlflow.db'}",
        workdir=workdir,
        search_space_path=search_space_path,
        objective_path=objective_path,
        env_references=tuple(env_references),
        unset_env=tuple(unset or ()),
    )


def _check_objective_kind(path: Path, file: StudyFile, objective: Objective, space: SearchSpace) -> None:
    """A serving study names its model; a job study tunes env vars only and passes no server flags."""
    server = file.server
    if not objective.is_job:
        if server.model_path is None:
            raise ConfigError(
                path,
                "server.model_path",
                None,
                f"the serving objective {objective.name!r} launches a model server, which needs a model",
                "Set server.model_path to the model's folder (or Hugging Face id).",
            )
        return
    for section, value in (("model_path", server.model_path), ("draft_model_path", server.draft_model_path)):
        if value is not None:
            raise ConfigError(
                path,
                f"server.{section}",
                value,
                f"the {objective.kind} objective runs a benchmark job, which loads no model",
                f"Remove server.{section}.",
            )
    if server.flags:
        flag = next(iter(server.flags))
        raise ConfigError(
            path,
            f"server.flags.{flag}",
            flag,
            f"the {objective.kind} objective runs a benchmark job, which takes no server flags",
            "Remove server.flags; what the job measures is set in the objective file.",
        )
    for name, parameter in space.parameters.items():
        if parameter.kind != "nccl":
            raise ConfigError(
                space.path,
                f"parameters.{name}",
                name,
                f"a {parameter.kind} parameter cannot change a {objective.kind} job, which runs no server",
                "Use a search space of NCCL env vars only, e.g. search_spaces/nccl-allreduce.yaml.",
            )


def _resolve_node_files(path: Path, file: StudyFile, study_dir: Path) -> StudyFile:
    """SSH nodes' key and known-hosts files as absolute paths (relative ones start at the study's folder),
    checked to exist; and a server the driver cannot reach refused before any trial."""
    nodes = []
    for index, node in enumerate(file.nodes):
        if not node.is_ssh:
            nodes.append(node)
            continue
        where = f"nodes[{index}]"
        update: dict[str, str] = {}
        if node.key_file is not None:
            update["key_file"] = str(_absolute(study_dir, node.key_file))
            if not Path(update["key_file"]).is_file():
                raise ConfigError(
                    path,
                    f"{where}.key_file",
                    node.key_file,
                    f"no such file: {update['key_file']}",
                    "Point key_file at the private key that logs in to the node.",
                )
        update["known_hosts"] = str(_absolute(study_dir, node.known_hosts))
        if not node.accept_unknown_host_key and not Path(update["known_hosts"]).is_file():
            address = parse_ssh_address(node.address)
            raise ConfigError(
                path,
                f"{where}.known_hosts",
                node.known_hosts,
                f"no such file: {update['known_hosts']}, so the node's host key cannot be checked",
                f"Create it (ssh-keyscan -p {address.port} {address.host} > {update['known_hosts']}, then "
                "compare the fingerprint with the node's), or set accept_unknown_host_key: true.",
            )
        address = parse_ssh_address(node.address)
        if node.benchmark_from == "driver" and is_loopback(file.server.host) and not address.is_loopback:
            raise ConfigError(
                path,
                "server.host",
                file.server.host,
                f"the server would listen on the loopback of {node.name}, which the driver cannot reach",
                "Set server.host: 0.0.0.0 (and let the driver reach the port), or benchmark_from: node.",
            )
        nodes.append(node.model_copy(update=update))
    return file.model_copy(update={"nodes": nodes})


def _absolute(study_dir: Path, value: str) -> Path:
    target = Path(value).expanduser()
    return target if target.is_absolute() else study_dir / target


def _named_file(path: Path, study_dir: Path, field: str, value: str) -> Path:
    target = Path(value).expanduser()
    target = (target if target.is_absolute() else study_dir / target).resolve()
    if not target.is_file():
        problem = "is a folder, not a file" if target.is_dir() else f"no such file: {target}"
        raise ConfigError(
            path,
            field,
            value,
            problem,
            f"Fix the path; a relative path starts at the study file's folder {study_dir}.",
        )
    return target


def _check_against_search_space(path: Path, file: StudyFile, space: SearchSpace) -> None:
    """The rules that need both files: overlaps, never_launch, and speculation's draft model."""
    server, never = file.server, file.never_launch
    for section, names in (("flags", server.flags), ("env", server.env)):
        for name in names:
            if name in space:
                raise ConfigError(
                    path,
                    f"server.{section}.{name}",
                    name,
                    f"is also tuned by the search space {space.path}",
                    "Keep it in one place: remove it from the study file or from the search space.",
                )

    for name, parameter in space.parameters.items():
        if parameter.kind == "nccl":
            for forbidden in never.env.get(name, []):
                if parameter.can_produce_env(forbidden):
                    field, value = _where_it_produces(name, parameter, forbidden)
                    raise ConfigError(
                        space.path,
                        field,
                        value,
                        f"can launch {name}={forbidden}, which never_launch in {path} forbids",
                        f"Remove that value from {name}'s choices.",
                    )
        elif name in never.flags and parameter.can_pass_flag():
            raise ConfigError(
                space.path,
                f"parameters.{name}",
                name,
                f"can pass {name}, which never_launch in {path} forbids",
                f"Remove {name} from the search space.",
            )

    for name, value in server.env.items():
        if value in never.env.get(name, []):
            raise ConfigError(
                path,
                f"server.env.{name}",
                value,
                "never_launch forbids this value",
                f"Remove {name} or change it.",
            )
    for flag in server.flags:
        if flag in never.flags:
            raise ConfigError(
                path, f"server.flags.{flag}", flag, "never_launch forbids this flag", f"Remove {flag}."
            )
    for token in server.command:
        if token.split("=", 1)[0] in never.flags:
            raise ConfigError(
                path, "server.command", token, "never_launch forbids this flag", "Remove it from the command."
            )

    _check_speculation(path, file, space)


def _where_it_produces(name: str, parameter: object, forbidden: str) -> tuple[str, object]:
    if isinstance(parameter, CategoricalParameter):
        for index, choice in enumerate(parameter.choices):
            if choice is not None and to_env_value(choice) == forbidden:
                return f"parameters.{name}.choices[{index}]", choice
    if isinstance(parameter, BoolParameter):
        return f"parameters.{name}.type", "bool"
    return f"parameters.{name}", forbidden


def _check_speculation(path: Path, file: StudyFile, space: SearchSpace) -> None:
    server = file.server
    base_algorithm = server.flags.get(SpeculativeRules.ALGORITHM)
    if SpeculativeRules.ALGORITHM not in space and base_algorithm is None:
        for name in space:
            if SpeculativeRules.is_speculative_flag(name):
                raise ConfigError(
                    space.path,
                    f"parameters.{name}",
                    name,
                    f"speculation is never on, so {name} would never matter",
                    f"Add {SpeculativeRules.ALGORITHM} to the search space or to server.flags in {path}.",
                )
    algorithms = [base_algorithm, *(space.possible_values(SpeculativeRules.ALGORITHM) or [])]
    needing = [str(a) for a in algorithms if SpeculativeRules.needs_draft_model(a)]
    if needing and server.draft_model_path is None:
        source = (
            "server.flags"
            if SpeculativeRules.needs_draft_model(base_algorithm)
            else f"search space {space.path}"
        )
        raise ConfigError(
            path,
            "server.draft_model_path",
            None,
            f"the {source} can turn on {needing[0]} speculation, which needs draft weights",
            "Set server.draft_model_path to the draft model (e.g. the EAGLE-3 head for this model).",
        )
