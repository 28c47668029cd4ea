"""`autotune init`: a commented study file for the node in front of you and the model it will serve.

The node side (`autotune.node.inspect`) asks the node, through the same runner and checks a study uses, for
its GPUs, their links, its SGLang and the model's config.json, and returns `NodeFacts` and `ModelFacts`.
Here the class of the pair (one GPU or several; dense or MoE; with an EAGLE-3 draft or not) picks the
shipped search space and objective (`choose`), and `study_text` writes the study file, each field with a
comment saying why it is there and what to change. Nothing here touches the node.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.config.hosts import AddressError, parse_ssh_address
from autotune.config.search_space import SearchSpace
from autotune.config.study import NodeSpec, is_simulated
from autotune.dialect import Dialect, FlagTable, Held
from autotune.errors import AutotuneError, ConfigError
from autotune.trial.launch import is_env_name, to_arg
from autotune.trial.redaction import is_secret_name

__all__ = [
    "DEFAULT_SERVER_COMMAND",
    "SHIPPED_DIR",
    "Choice",
    "InitError",
    "ModelFacts",
    "NodeFacts",
    "choose",
    "default_port",
    "held_knobs",
    "is_simulated",
    "model_facts",
    "node_path",
    "node_spec",
    "parse_env",
    "parse_port",
    "simulated_nvidia_smi",
    "study_name",
    "study_text",
]

DEFAULT_SERVER_COMMAND = ("python3", "-m", "sglang.launch_server")
# The simulated node's modules that answer nvidia-smi and run the all-reduce job.
SIMULATED_NVIDIA_SMI = "autotune.sim.nvidia_smi"
SIMULATED_NCCL_JOB = "autotune.sim.nccl_job"
# search_spaces/, objectives/ and examples/ sit beside the package in a checkout, and inside it once
# installed from a wheel (autotune/shipped/: setup.py puts them there).
_CHECKOUT = Path(__file__).resolve().parents[2]
SHIPPED_DIR = _CHECKOUT if (_CHECKOUT / "search_spaces").is_dir() else _CHECKOUT / "autotune" / "shipped"
OBJECTIVE = "serving-throughput.yaml"
# The keys under which config.json files give the number of routed experts (Mixtral, DeepSeek, Qwen-MoE, ...).
EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
# A model whose weights take more than this share of the GPUs' memory leaves no room for a KV cache.
MAX_WEIGHT_SHARE = 0.9
TRIALS = 30
# Start-up: SGLang's own start (CUDA init, graph capture) plus reading the weights at 0.5 GB/s, a slow disk.
STARTUP_BASE_S, STARTUP_S_PER_GB, STARTUP_MIN_S = 300.0, 2.0, 600.0
BENCHMARK_S = 900.0
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
# The simulated node's clock, where --env sets none: a trial in seconds. The client times a simulated server
# by its model clock, so the clock sets how long a trial takes, not what it measures.
SIMULATED_CLOCK = {
    "SGLANG_SIM_TIME_SCALE": ("0.2", "serving 5x faster than real time"),
    "SGLANG_SIM_STARTUP_TIME_SCALE": ("0.001", "start-up 1000x faster: a minute's weight load takes 0.06 s"),
}
# Its run-to-run noise, where --env sets none: measured exactly, a simulated node without noise would have
# a gain of 0.02% confirmed as an answer.
SIMULATED_NOISE = ("SGLANG_SIM_NOISE", "calibrated", "the simulated node's run-to-run noise, as on H200s")


class InitError(AutotuneError):
    """`autotune init` cannot write a study for this node or model: what is missing and what to do."""


@dataclass(frozen=True)
class ModelFacts:
    """A model folder as its config.json and weight files describe it."""

    path: str
    architecture: str
    experts: int  # routed experts per MoE layer; 0 for a dense model
    hidden_size: int | None
    layers: int | None
    kv_heads: str | None  # "8", or "MLA" for a latent KV cache
    weight_bytes: int | None
    weight_source: str  # where weight_bytes came from
    remote_code: bool  # config.json maps its classes to the folder's own code (auto_map)
    eagle3: bool  # an EAGLE-3 draft head

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def weight_gb(self) -> float | None:
        return self.weight_bytes / 1e9 if self.weight_bytes else None

    def describe(self) -> str:
        shape = [f"{self.experts} experts (MoE)" if self.moe else "dense"]
        shape += [f"{self.layers} layer{'s' if self.layers > 1 else ''}"] if self.layers else []
        shape += [f"hidden {self.hidden_size}"] if self.hidden_size else []
        shape += [f"{self.kv_heads} KV heads" if self.kv_heads != "MLA" else "MLA"] if self.kv_heads else []
        if not self.weight_bytes:
            weights = "weight size unknown (no safetensors files or index found)"
        elif self.weight_bytes < 1e6:  # stand-in files, as in the tests' model folders
            weights = f"{self.weight_bytes} bytes of weights ({self.weight_source})"
        else:
            weights = f"{self.weight_bytes / 1e9:.1f} GB of weights ({self.weight_source})"
        return f"{self.path}: {self.architecture}, {', '.join(shape)}; {weights}"


def _sections(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """config.json and the text model's section of a multimodal one."""
    nested = [config.get(key) for key in ("text_config", "llm_config", "language_config")]
    return [config, *(n for n in nested if isinstance(n, Mapping))]


def _first_int(config: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    for section in _sections(config):
        for key in keys:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def model_facts(
    path: str, config: Mapping[str, Any], *, index_total_bytes: int | None, files_bytes: int | None
) -> ModelFacts:
    """What config.json says of the model at `path`; its weights' size from the safetensors index's
    `metadata.total_size` (what the weights are, even where the files are not all there) or else the
    safetensors files' sizes."""
    architectures = config.get("architectures")
    architecture = (
        str(architectures[0])
        if isinstance(architectures, list) and architectures
        else str(config.get("model_type") or "unknown architecture")
    )
    mla = any("kv_lora_rank" in section for section in _sections(config))
    kv_heads = _first_int(config, ("num_key_value_heads", "num_attention_heads"))
    if index_total_bytes:
        weights, source = index_total_bytes, "the safetensors index's metadata.total_size"
    elif files_bytes:
        weights, source = files_bytes, "the safetensors files' sizes"
    else:
        weights, source = None, ""
    return ModelFacts(
        path=path,
        architecture=architecture,
        experts=_first_int(config, EXPERT_KEYS) or 0,
        hidden_size=_first_int(config, ("hidden_size", "d_model")),
        layers=_first_int(config, ("num_hidden_layers", "n_layer", "num_layers")),
        kv_heads="MLA" if mla else (str(kv_heads) if kv_heads else None),
        weight_bytes=weights,
        weight_source=source,
        remote_code=bool(config.get("auto_map")),
        eagle3="eagle3" in architecture.lower() or "eagle_config" in config,
    )


@dataclass(frozen=True)
class NodeFacts:
    """A node as `autotune.node.inspect` found it: its GPUs, how they are linked, its SGLang."""

    name: str
    address: str
    gpus: int
    gpu_name: str
    gpu_memory_mib: float  # the smallest GPU's
    driver: str
    links: str | None  # the slowest path between two GPUs as `nvidia-smi topo -m` says it (NV18, SYS, ...)
    sglang_version: str | None
    flags: FlagTable | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def nvlink(self) -> bool:
        return bool(self.links and self.links.startswith("NV"))

    @property
    def gpu_memory_gb(self) -> float:
        return self.gpu_memory_mib * 1.048576 / 1000

    def describe(self) -> str:
        links = (
            "one GPU"
            if self.gpus == 1
            else f"NVLink ({self.links})"
            if self.nvlink
            else f"PCIe ({self.links or 'path unknown'})"
        )
        driver = f", driver {self.driver}" if self.driver else ""
        return f"{self.gpus}x {self.gpu_name} ({self.gpu_memory_mib / 1024:.0f} GiB{driver}), {links}"

    def describe_sglang(self) -> str:
        version = f"SGLang {self.sglang_version}" if self.sglang_version else "SGLang (version not reported)"
        if self.flags is None:
            return f"{version}; its flags unknown (no committed table, no --help): flags pass unchanged"
        return f"{version}; {len(self.flags.options)} options from {_shown(self.flags.source)}"


@dataclass(frozen=True)
class Choice:
    """The shipped search space and objective for a class of node and model, and why."""

    search_space: Path
    objective: Path
    why: str


def choose(node: NodeFacts, model: ModelFacts, draft: ModelFacts | None) -> Choice:
    """The search space for the class (one GPU or several; dense or MoE; a speculative part only with an
    EAGLE-3 draft) and the serving objective."""
    if draft is not None and not draft.eagle3:
        raise InitError(
            f"the draft model {draft.path} ({draft.architecture}) is not an EAGLE-3 head, the only draft the "
            "shipped search spaces tune. Leave out --draft, or write the study with the speculative knobs "
            "for your draft by hand (search_spaces/one-gpu-eagle3.yaml shows them)."
        )
    if node.gpus == 1:
        name, why = "one-gpu", "one GPU, so no NCCL knobs: one GPU does no all-reduce"
        if model.moe:
            why += "; MoE on one GPU: no expert parallelism to tune"
    elif model.moe:
        name, why = (
            "multi-gpu-moe",
            f"{node.gpus} GPUs serving a MoE model: all-reduce and expert-parallel knobs",
        )
    else:
        name, why = "multi-gpu", f"{node.gpus} GPUs serving a dense model: all-reduce knobs"
    if draft is not None:
        name += "-eagle3"
        why += "; an EAGLE-3 draft: the speculative knobs too"
    return Choice(SHIPPED_DIR / "search_spaces" / f"{name}.yaml", SHIPPED_DIR / "objectives" / OBJECTIVE, why)


def parse_env(pairs: Sequence[str], out: Path) -> dict[str, str]:
    """`--env KEY=VALUE` arguments as the node's environment for the server."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not is_env_name(key):
            raise ConfigError(
                out,
                "--env",
                pair,
                "not KEY=VALUE with a variable name",
                "Write e.g. --env PYTHONPATH=/opt/sglang.",
            )
        env[key] = value
    return env


def parse_port(port: str, out: Path) -> int | str:
    """`--port`: a TCP port, or `auto` (the node picks a free one for each launch)."""
    if port == "auto" or (port.isdigit() and 1 <= int(port) <= 65535):
        return port if port == "auto" else int(port)
    raise ConfigError(out, "--port", port, "not a TCP port", "Use 1..65535, or auto.")


def default_port(command: Sequence[str]) -> int | str:
    """The port a study gets without --port: a free one for each launch on the simulated node (studies on
    one machine side by side), SGLang's own 30000 on a real one (a fixed port the node check can test)."""
    return "auto" if is_simulated(command) else 30000


def node_spec(address: str, out: Path, **login: str | None) -> NodeSpec:
    """The study file's node for `--node`: `local`, or an ssh:// address with its `login` files
    (`key_file`, `known_hosts`: set ones are written to the study, as absolute paths)."""
    given = {name: str(Path(path).expanduser().resolve()) for name, path in login.items() if path is not None}
    if address == "local":
        for name, value in given.items():
            option = "--" + name.replace("_", "-")
            raise ConfigError(out, option, value, "only an ssh:// node logs in", "Remove it, or pass --node.")
        return NodeSpec(name="local", address="local")
    try:
        parsed = parse_ssh_address(address)
    except AddressError as exc:
        raise ConfigError(out, "--node", address, exc.problem, exc.fix) from None
    return NodeSpec.model_validate({"name": parsed.host, "address": address, **given})


def node_path(path: str, local: bool) -> str:
    """A folder as the study names it: absolute on a local node; as given on an ssh:// node (its home)."""
    return str(Path(path).expanduser().resolve()) if local else path


def simulated_nvidia_smi(command: Sequence[str]) -> list[str]:
    """The simulated node's nvidia-smi, run by the server command's Python."""
    return [command[0], "-m", SIMULATED_NVIDIA_SMI]


def study_name(model: ModelFacts, node: NodeFacts) -> str:
    """A study name from the model folder's name and the GPUs, e.g. `llama-3-8b-1x-h200`."""
    gpu = node.gpu_name.removeprefix("NVIDIA ").split()[0].lower() if node.gpu_name else "gpu"
    stem = Path(model.path.rstrip("/")).name or "model"
    return _NAME_CHARS.sub("-", f"{stem}-{node.gpus}x-{gpu}").strip("-.") or "study"


def held_knobs(space: SearchSpace, table: FlagTable) -> list[Held]:
    """The search space's flags that the node's SGLang does not take: trials leave them at its default."""
    dialect = Dialect(table, notice=lambda _text: None)
    held = []
    for name, parameter in space.parameters.items():
        if parameter.kind == "nccl":
            continue
        listed = space.possible_values(name)
        values = (
            [getattr(parameter, "low", None)] if listed is None else [v for v in listed if v is not False]
        )
        value = next((to_arg(v) for v in values if v is not None and v is not True), None)  # None: a switch
        found = dialect.translate_flag(name, value)
        if isinstance(found, Held):
            held.append(found)
    return held


def _y(value: Any) -> str:
    """A YAML value: JSON's spelling of it is valid YAML and quotes what needs quoting."""
    return json.dumps(value)


def _relative(target: Path, folder: Path) -> str:
    """`target` relative to a study folder in the checkout (the file moves with it), else absolute."""
    folder = folder.resolve()
    return os.path.relpath(target, folder) if folder.is_relative_to(SHIPPED_DIR) else str(target)


def _shown(path: str) -> str:
    """A path inside the checkout as the checkout names it."""
    return str(Path(path).relative_to(SHIPPED_DIR)) if Path(path).is_relative_to(SHIPPED_DIR) else path


def _comment(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines of at most 110 characters."""
    return textwrap.wrap(text, 110, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def study_text(
    *,
    out: Path,
    name: str,
    node: NodeFacts,
    model: ModelFacts,
    draft: ModelFacts | None,
    command: Sequence[str],
    env: Mapping[str, str],
    spec: NodeSpec | None = None,
    port: int | str = 30000,
    written_on: str = "",
) -> str:
    """The study file for `model` on `node`, with a comment on every field (why it is there, what to change).

    `env` is the node's environment for the server as given with --env (PYTHONPATH, say); `out` is where
    the file goes (the search space and objective are named relative to its folder)."""
    choice = choose(node, model, draft)
    check_fits(node, model, draft)
    folder = out.parent
    simulated = is_simulated(command)
    ssh = node.address != "local"
    several = node.gpus > 1
    lines = _comment(
        f"Written by `autotune init`{written_on} for {node.name}: {node.describe()}, "
        f"{node.describe_sglang()}."
    )
    lines += _comment(f"Model: {model.describe()}.")
    if draft is not None:
        lines += _comment(f"Draft: {draft.describe()}.")
    lines += [
        *_comment(
            f"Check it with `autotune validate {out.name}` (it launches nothing), run it with "
            f"`autotune run {out.name}`."
        ),
        "",
        "# The study's name: its Optuna study, MLflow experiment and folder (.autotune/<name>/ here).",
        f"study: {_y(name)}",
        *_comment(
            f"The knobs tuned, for this class of node and model ({choice.why}). search_spaces/ holds the "
            "others; copy this one beside the study to narrow or widen a range."
        ),
        f"search_space: {_y(_relative(choice.search_space, folder))}",
        "# What a trial measures and maximizes: output tok/s of a fixed workload. Change its workload to",
        "# your traffic (prompt and answer lengths, requests in flight), or name another of objectives/.",
        f"objective: {_y(_relative(choice.objective, folder))}",
        "nodes:",
    ]
    if simulated:
        lines.append(
            "  # The simulated node answers nvidia-smi from its hardware profile (SGLANG_SIM_HARDWARE)."
        )
    elif ssh:
        lines.append(
            "  # Reached over SSH from where autotune runs; its host key must be in ~/.ssh/known_hosts."
        )
    else:
        lines.append(
            "  # local: autotune runs on the GPU node itself (for a node reached over SSH: autotune init "
            "--node ssh://user@host)."
        )
    node_entry: dict[str, Any] = {"name": node.name, "address": node.address}
    for name in ("key_file", "known_hosts"):
        if spec is not None and name in spec.model_fields_set:
            node_entry[name] = getattr(spec, name)
    if simulated:
        node_entry["nvidia_smi"] = simulated_nvidia_smi(command)
    lines.append("  - {" + ", ".join(f"{k}: {_y(v)}" for k, v in node_entry.items()) + "}")
    lines += ["server:"]
    if simulated:
        lines.append("  # The simulated SGLang node; for a real one: [python3, -m, sglang.launch_server].")
    else:
        lines.append(
            "  # The node's Python with SGLang (found there by autotune init), as SGLang's own launcher."
        )
    lines.append(f"  command: {_y(list(command))}")
    if simulated:
        lines.append("  # The model's folder: the simulated node reads its config.json and weights' size")
        lines.append("  # (not the weights) and serves that shape (unless SGLANG_SIM_MODEL names one).")
    else:
        lines.append("  # The model's folder on the node.")
    lines.append(f"  model_path: {_y(model.path)}")
    if draft is not None:
        lines.append(
            "  # The EAGLE-3 draft head; trials turn speculative decoding on and off (the search space)."
        )
        lines.append(f"  draft_model_path: {_y(draft.path)}")
    weight_gb = _weight_gb(model)
    if weight_gb is not None:
        lines += _comment(
            f"The target model's weights' size (from {model.weight_source}), for the pre-flight memory "
            "check, which rejects configs certain to run out of memory without launching them.",
            "  ",
        )
        lines.append(f"  model_weight_gb: {weight_gb}")
    else:
        lines.append(
            "  # model_weight_gb: N   # the weights' size, unknown here; set it where the weights are not"
        )
        lines.append(
            "  #                       # on disk (--load-format dummy) for the pre-flight memory check"
        )
    if ssh:
        lines.append("  # Listen on every address, so that autotune reaches the server from where it runs.")
        lines.append(f"  host: {_y('0.0.0.0')}")
    lines.append("  # The server's port on the node; any free one (auto: a free one for each launch).")
    lines.append(f"  port: {_y(port)}")
    flags: list[tuple[str, str, Any]] = []
    if several:
        flags.append(
            (
                "--tp-size",
                f"all {node.gpus} GPUs in one tensor-parallel group; fewer: set CUDA_VISIBLE_DEVICES",
                node.gpus,
            )
        )
    if model.remote_code or (draft is not None and draft.remote_code):
        flags.append(
            ("--trust-remote-code", "config.json names the model folder's own code (auto_map)", True)
        )
    if flags:
        lines.append("  # Held in every trial (the search space tunes the rest).")
        lines.append("  flags:")
        for flag, why, value in flags:
            lines.append(f"    {flag}: {_y(value)}   # {why}")
    env_lines = _env_lines(node, env, simulated)
    if env_lines:
        lines.append("  env:")
        lines += env_lines
    if several and model.hidden_size:
        lines += _nccl_stage_lines(model, command, simulated)
    lines += [
        f"# When the study stops: {TRIALS} trials (each a server start and a benchmark), or add timeout_s.",
        f"budget: {{n_trials: {TRIALS}}}",
    ]
    lines += (
        [
            "# TPE, seeded: a rerun runs the same trials and gives the same answer. The simulated node",
            "# draws each trial's noise from this seed and the trial's number (SGLANG_SIM_SEED) and is",
            "# timed by its own clock, so a rerun measures every trial the same and TPE proposes the same",
            "# next ones (a workload at a request_rate is sent by the client's clock: it varies a little).",
        ]
        if simulated
        else [
            "# TPE, seeded: a rerun proposes the same first trials (its random start); later proposals",
            "# follow the measurements, which differ a little from run to run on real GPUs.",
        ]
    )
    lines += [
        "sampler: {name: tpe, seed: 1}",
    ]
    startup = _startup_s(weight_gb)
    lines += _comment(
        f"A server not ready within startup_s is a hang ({_startup_why(weight_gb)}); a benchmark longer than "
        "benchmark_s too. Raise them for a slow disk or a long workload."
    )
    lines.append(f"timeouts: {{startup_s: {startup:g}, benchmark_s: {BENCHMARK_S:g}}}")
    return "\n".join(lines) + "\n"


def _weight_gb(model: ModelFacts) -> float | None:
    return math.ceil(model.weight_gb * 10) / 10 if model.weight_gb is not None else None


def check_fits(node: NodeFacts, model: ModelFacts, draft: ModelFacts | None) -> None:
    """Raises `InitError` when the weights alone would fill the node's GPUs: no study can serve the model."""
    weight_gb = _weight_gb(model)
    if weight_gb is not None and draft is not None:
        weight_gb += draft.weight_gb or 0.0
    room = MAX_WEIGHT_SHARE * node.gpus * node.gpu_memory_gb
    if weight_gb is not None and weight_gb > room:
        raise InitError(
            f"the model's weights ({weight_gb:.1f} GB) do not fit on {node.describe()}: tensor parallelism "
            f"over all {node.gpus} GPU(s) leaves room for {room:.0f} GB of weights and a KV cache. Use a "
            "node with more GPU memory, or a quantized model (FP8, INT4)."
        )


def _env_lines(node: NodeFacts, env: Mapping[str, str], simulated: bool) -> list[str]:
    lines = []
    for name, value in env.items():
        if is_secret_name(name):  # never in clear in a file: read from the environment when the study runs
            value, why = f"${{{name}}}", f"a secret: export {name} where you run autotune"
        elif simulated and name.startswith("SGLANG_SIM_"):
            why = "the simulated node's setting (autotune/sim/sglang_server.py lists them)"
        else:
            why = "given with --env: the node needs it to run SGLang"
        lines.append(f"    {name}: {_y(value)}   # {why}")
    if simulated:
        lines += [
            f"    {name}: {_y(value)}   # the simulated node's clock: {why}"
            for name, (value, why) in SIMULATED_CLOCK.items()
            if name not in env
        ]
        name, value, why = SIMULATED_NOISE
        if name not in env:
            lines.append(f"    {name}: {_y(value)}   # {why}")
    if node.gpus > 1 and node.nvlink:
        # Each library's own switch for it, and whose it is.
        multicast = {
            "NCCL_NVLS_ENABLE": ("0", "NCCL's"),
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": ("1", "torch symmetric memory's"),
            "NVSHMEM_DISABLE_NVLS": ("1", "NVSHMEM's"),
        }
        missing = {k: v for k, v in multicast.items() if k not in env}
        if missing:
            lines += _comment(
                "NVLink multicast (NVLS) off, as never_launch keeps it in every trial: set here too, so that "
                "no library turns it on by itself where the NVSwitch offers it. Remove these where your "
                "fabric allows multicast (and drop it from never_launch).",
                "    ",
            )
            lines += [f"    {k}: {_y(value)}   # {whose}" for k, (value, whose) in missing.items()]
    return lines


def _nccl_stage_lines(model: ModelFacts, command: Sequence[str], simulated: bool) -> list[str]:
    stage: dict[str, Any] = {"hidden_size": model.hidden_size}
    lines = [
        "# The NCCL stage runs after the baseline: the NCCL knobs tuned on all-reduces alone, seconds a",
        "# trial, their best held in every server trial. The hidden size (the all-reduced rows' width) is",
        "# config.json's, written here so that the stage needs no access to the model's folder from where",
        "# autotune runs.",
    ]
    if simulated:
        stage["command"] = [command[0], "-m", SIMULATED_NCCL_JOB]
        lines.append("# The simulated node's all-reduce job stands in for python3 -m autotune.measure.nccl.")
    else:
        lines.append("# Its job, python3 -m autotune.measure.nccl, needs autotune and torch on the node;")
        lines.append("# `nccl_stage: off` skips the stage.")
    lines.append("nccl_stage: {" + ", ".join(f"{k}: {_y(v)}" for k, v in stage.items()) + "}")
    return lines


def _startup_s(weight_gb: float | None) -> float:
    if weight_gb is None:
        return 1800.0  # the study file's default: the weights' size is unknown
    seconds = max(STARTUP_MIN_S, STARTUP_BASE_S + STARTUP_S_PER_GB * weight_gb)
    return float(math.ceil(seconds / 60) * 60)


def _startup_why(weight_gb: float | None) -> str:
    if weight_gb is None:
        return "the default: the weights' size is unknown"
    return (
        f"{STARTUP_BASE_S:g} s for SGLang's own start, and {weight_gb:g} GB of weights read at 0.5 GB/s, "
        f"at least {STARTUP_MIN_S:g} s"
    )
