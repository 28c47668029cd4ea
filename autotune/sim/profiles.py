"""Hardware and model profiles for the simulated node, loaded from YAML by name or path."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.config import load_yaml_text
from autotune.errors import ConfigError, did_you_mean

PROFILE_DIR = Path(__file__).parent / "profiles"

# NCCL's path types, nearest first; P2P is used when the GPUs' path is within NCCL_P2P_LEVEL.
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkProfile(_Profile):
    """Per-hop latency (by protocol) and usable bandwidth of one NCCL transport between two GPUs."""

    ll_hop_us: float = Field(gt=0, description="LL: the receiver polls flags in the sender's writes")
    simple_hop_us: float = Field(gt=0, description="Simple: a buffer slice handed over with a fence")
    bandwidth_gbps: float = Field(gt=0)


class NoiseProfile(_Profile):
    """Run-to-run noise of a node, as relative standard deviations (0.002 = 0.2%): what `SGLANG_SIM_NOISE=
    calibrated` draws. The defaults are the one GPU measured (h200-x1.yaml says from which runs); a profile
    without its own section borrows them."""

    run: float = Field(default=0.0018, ge=0, lt=1, description="a launch's speed: one config, one machine")
    step: float = Field(default=0.01, ge=0, lt=1, description="each scheduler step's time, within a launch")
    lease: float = Field(default=0.008, ge=0, lt=1, description="a lease's (machine's) GPU speed")
    eager_host: float = Field(
        default=0.35, ge=0, lt=2, description="a lease's host: log-spread (half-normal) of its eager dispatch"
    )


class HardwareProfile(_Profile):
    """One GPU node: its GPUs, memory, interconnect and what its architecture cannot run."""

    name: str
    gpu_name: str
    num_gpus: int = Field(gt=0)
    gpu_memory_gb: float = Field(gt=0)
    compute_capability: str
    memory_bandwidth_gbps: float = Field(gt=0, description="HBM/GDDR bandwidth per GPU")
    compute_tflops: float = Field(gt=0, description="dense throughput per GPU reached by prefill")
    interconnect: Literal["pcie", "nvlink"]
    gpu_path: Literal["NVL", "PIX", "PXB", "PHB", "SYS"] = Field(
        description="NCCL path type between the farthest pair of GPUs (SYS: across host bridges)"
    )
    host_bridges: int = Field(ge=0, description="PCIe host bridges the GPUs sit behind")
    p2p: LinkProfile
    shm: LinkProfile
    socket: LinkProfile
    nccl_default_channels: int = Field(gt=0)
    kernel_launch_us: float = Field(gt=0, description="the GPU's wait between two eager kernels")
    eager_op_us: float = Field(
        default=0.0,
        ge=0,
        description="host time to dispatch one op of an eager forward (Python, PyTorch, the launch); "
        "0 where it was never measured, so the host never holds the GPU back",
    )
    attention_factors: dict[str, float] = Field(
        default_factory=dict,
        description="measured attention time over reading the KV once at memory_bandwidth_gbps, by backend",
    )
    custom_allreduce_us: float = Field(gt=0, description="one custom all-reduce of a small tensor")
    proxy_wait_us: float = Field(
        default=0.0, ge=0, description="an eager all-reduce over shm/socket waiting on NCCL's proxy thread"
    )
    cuda_context_gb: float = Field(ge=0)
    noise: NoiseProfile = NoiseProfile()
    unsupported: list[
        Literal["flashinfer_allreduce_fusion", "torch_symm_mem", "expert_parallel_flashinfer_a2a", "fa3"]
    ] = []
    host_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="the host's memory: the page cache keeps the weights between launches when they fit "
        "(autotune.sim.model.startup); unset: never",
    )
    multithread_load_speedup: float = Field(
        default=1.0,
        ge=1,
        description="cold weight loading with SGLang's 8 loader threads over one thread (1: not known)",
    )
    disk_free_gb: float | None = Field(
        default=None,
        ge=0,
        description="free disk in the node's work folder, for presharded weight dumps (unset: not known, "
        "and autotune leaves them off, as on a node it cannot probe)",
    )


class DraftProfile(_Profile):
    """The EAGLE-3 draft model and how often the target accepts its tokens."""

    weight_gb: float = Field(ge=0)
    kv_bytes_per_token: int = Field(ge=0)
    step_ms: float = Field(gt=0, description="one draft forward at batch 1, all-reduces excluded")
    allreduces_per_step: int = Field(ge=0)
    accept_rate: float = Field(gt=0, lt=1, description="chance the target accepts the next chain token")
    default_spec: tuple[int, int, int] = Field(description="SGLang's (steps, topk, draft tokens) when unset")
    routing_overlap: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="how independently a sequence's extra draft tokens pick experts (1: as other sequences)",
    )
    verify_in_cuda_graph: bool = Field(
        default=True, description="False where the target's verify pass runs eagerly (the seed's node)"
    )


class StandardWorkload(_Profile):
    """The workload on which the profile's calibration figures are stated."""

    num_prompts: int = Field(gt=0)
    input_len: int = Field(gt=0)
    output_len: int = Field(gt=0)
    concurrency: int = Field(gt=0)


class ModelProfile(_Profile):
    """A served model: weights, layers, communication per forward, KV cache and compute per token."""

    name: str
    served_model_name: str
    weight_gb: float = Field(gt=0, description="all weights, across all GPUs")
    num_shards: int = Field(gt=0)
    load_gbps: float = Field(gt=0, description="weight loading throughput from disk, whole node")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    context_len: int = Field(gt=0)
    dtype: str
    quantization: str | None = None
    allreduces_per_layer: int = Field(ge=0)
    kv_bytes_per_token: int = Field(gt=0, description="KV cache bytes per token for the whole model")
    kv_sharded_by_tp: bool = Field(description="False for MLA, whose latent cache every rank holds")
    dense_read_gb: float = Field(ge=0, description="weights read every decode step, whole model")
    num_experts: int = Field(ge=0)
    experts_per_token: int = Field(ge=0)
    expert_gb: float = Field(ge=0, description="one expert across all layers")
    active_params_b: float = Field(gt=0, description="parameters used per token, billions")
    kernels_per_layer: int = Field(gt=0)
    step_overhead_ms: float = Field(ge=0, description="scheduler and sampling work per step")
    sampling_us_per_request: float = Field(
        default=0.0,
        ge=0,
        description="what each request of a decode step adds outside the forward: its logits' sampling "
        "(0 where never measured: step_overhead_ms holds it at the batch it was calibrated at)",
    )
    runtime_overhead_gb: float = Field(ge=0, description="workspaces allocated with the weights, per GPU")
    graph_mb_per_bs: float = Field(ge=0, description="CUDA graph pool per captured batch size unit")
    activation_mb_per_token: float = Field(gt=0, description="peak activations per prefill token")
    prefill_graph_mb_per_token: float = Field(
        default=0.0,
        ge=0,
        description="what breakable prefill graphs keep per token of their largest graph, per GPU "
        "(0 where never measured: only each graph's own few MiB)",
    )
    default_attention_backend: str
    architecture: str = Field(description="the Hugging Face architecture SGLang loads (its model class)")
    draft: DraftProfile | None = None
    standard_workload: StandardWorkload


def _load(kind: str, name_or_path: str, model: type[_Profile]) -> _Profile:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        shipped = sorted(p.stem for p in (PROFILE_DIR / kind).glob("*.yaml"))
        path = PROFILE_DIR / kind / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(
                path,
                "",
                name_or_path,
                f"no shipped {kind} profile by that name",
                f"Use one of {shipped} or a path to a YAML file.{did_you_mean(name_or_path, shipped)}",
            )
    try:
        data = load_yaml_text(path.read_text())
    except OSError as exc:
        raise ConfigError(path, "", name_or_path, f"cannot read the {kind} profile", str(exc)) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(path, field, err.get("input"), err["msg"], "Fix the profile field.") from exc


def load_hardware_profile(name_or_path: str) -> HardwareProfile:
    """Load a shipped hardware profile by name or any hardware profile YAML by path."""
    profile = _load("hardware", name_or_path, HardwareProfile)
    assert isinstance(profile, HardwareProfile)  # _load returns the class it was given
    return profile


def load_model_profile(name_or_path: str) -> ModelProfile:
    """Load a shipped model profile by name or any model profile YAML by path."""
    profile = _load("models", name_or_path, ModelProfile)
    assert isinstance(profile, ModelProfile)
    return profile
