"""`NodePerformanceModel`: the model's answer for one launch, what SGLang resolves from its settings, and one
method or attribute per question the server, the engine and the tests ask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.sim.model import failures, memory, timing
from autotune.sim.model.nccl import NcclModel
from autotune.sim.model.noise import SimNoise
from autotune.sim.model.settings import LaunchSettings, SpecSettings, accept_length
from autotune.sim.predictability import request_accept_rate
from autotune.sim.profiles import HardwareProfile, ModelProfile
from autotune.sim.versions import DEFAULT_VERSION, VERSIONS, SglangVersion

if TYPE_CHECKING:
    from autotune.sim.engine import Engine

# Architectures SGLang 0.5.17 turns FlashInfer all-reduce fusion on for (arg_groups/overrides.py:1863-1882).
FLASHINFER_FUSION_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GptOssForCausalLM", "GlmMoeDsaForCausalLM",
        "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM", "Qwen3MoeForCausalLM",
        "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM", "KimiK25ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    }
)  # fmt: skip
EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")


class NodePerformanceModel:
    """The model's answer for one launch on one node: memory, failures, and step times."""

    def __init__(
        self,
        hw: HardwareProfile,
        model: ModelProfile,
        settings: LaunchSettings,
        version: SglangVersion = VERSIONS[DEFAULT_VERSION],
    ) -> None:
        self.hw = hw
        self.model = model
        self.settings = settings
        self.version = version
        self._allreduce_us: dict[tuple[float, bool], float] = {}
        self.eager_host = 1.0  # this lease's host over the profile's eager dispatch (set by its noise)
        # What the node kept from earlier launches (autotune.sim.model.startup; set by whoever runs them).
        self.weights_cached = False  # the weights are in the host's page cache
        self.weights_kept = 0.0  # the share of them the node kept in the page cache before the launch
        self.compile_cache_warm = False  # the JIT/compile caches hold this launch's kernels
        self.gpu_held_gb = 0.0  # each GPU's memory another process holds (a weight cache daemon)
        self.weights_mapped = False  # the weights are mapped from that daemon, not loaded
        self.weights_presharded = False  # a presharded dump of this launch's layout is on the node's disk
        self.tp = settings.tp_size
        self.warnings: list[str] = []
        self.notes: list[str] = []  # what SGLang logs at info level while it resolves its arguments
        self.spec = self._resolve_spec()
        self.custom_allreduce = self._custom_allreduce_enabled()
        self.nccl = NcclModel(settings.nccl, hw, self.tp)
        if self._auto_flashinfer_fusion and not settings.enable_flashinfer_allreduce_fusion:
            self.notes.append(
                f"Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for {model.architecture}"
            )
        if settings.enable_torch_symm_mem and "torch_symm_mem" in hw.unsupported:
            # Only SM 9 and 10 have sizes (all_reduce_utils.py:3-16): the communicator is skipped, no crash.
            self.warnings.append(
                f"TorchSymmMemCommunicator: Device capability {hw.compute_capability.split('.')[0]} not "
                "supported, communicator is not available."
            )
        self.plan = memory.plan_memory(self)
        self.startup_failure = failures.startup_failure(self)

    def share_gpu(self, held_gb: float, mapped: bool) -> None:
        """A weight cache daemon holds `held_gb` of each GPU and, `mapped`, this launch maps its weights
        from it instead of loading them: the memory plan and the start-up follow."""
        self.gpu_held_gb, self.weights_mapped = held_gb, mapped
        self.plan = memory.plan_memory(self)
        self.startup_failure = failures.startup_failure(self)

    # -- settings ---------------------------------------------------------------------------------------
    @property
    def accept_length(self) -> float | None:
        return self.spec.accept_length if self.spec else None

    def accept_length_for(self, predictability: float) -> float | None:
        """The accept length of a request whose prompt has this predictability (see sim.predictability)."""
        spec, draft = self.spec, self.model.draft
        if spec is None or draft is None or predictability <= 0:
            return self.accept_length
        rate = request_accept_rate(draft.accept_rate, predictability)
        return accept_length(rate, spec.num_steps, spec.topk, spec.num_draft_tokens)

    def _resolve_spec(self) -> SpecSettings | None:
        s, draft = self.settings, self.model.draft
        if s.speculative_algorithm not in EAGLE_ALGORITHMS or draft is None:
            return None
        steps, topk, tokens = (
            s.speculative_num_steps,
            s.speculative_eagle_topk,
            s.speculative_num_draft_tokens,
        )
        if steps is None:
            steps, topk, tokens = draft.default_spec
        topk = topk or 1
        if topk == 1:
            tokens = steps + 1  # SGLang forces a chain: one draft token per step plus the bonus token
        tokens = tokens or steps + 1
        return SpecSettings(steps, topk, tokens, accept_length(draft.accept_rate, steps, topk, tokens))

    def _custom_allreduce_enabled(self) -> bool:
        s, hw = self.settings, self.hw
        if s.disable_custom_all_reduce or self.tp not in (2, 4, 6, 8):
            return False
        if hw.interconnect == "nvlink" or self.tp == 2 or s.force_custom_allreduce:
            return True
        self.warnings.append(
            "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
            "To silence this warning, specify --disable-custom-all-reduce explicitly."
        )
        return False

    @property
    def attention_backend(self) -> str:
        """The flag, else the backend SGLang picks for this GPU (B9; harness: Kimi-K2.5 gets triton on SM120
        and fa3 on SM90; on SM90 an EAGLE tree (topk > 1) gets triton, other models fa3)."""
        if self.settings.attention_backend:
            return self.settings.attention_backend
        major = int(self.hw.compute_capability.split(".")[0])
        if major != 9:
            return "triton" if self.uses_mla else self.model.default_attention_backend
        return "triton" if self.spec and self.spec.topk > 1 else "fa3"

    @property
    def flashinfer_fusion(self) -> bool:
        """FlashInfer all-reduce fusion: asked for, or turned on by SGLang for the architectures it lists on
        SM90 and SM10X (B8; arg_groups/overrides.py:1863-1907)."""
        return self.settings.enable_flashinfer_allreduce_fusion or self._auto_flashinfer_fusion

    @property
    def _auto_flashinfer_fusion(self) -> bool:
        s = self.settings
        return (
            self.model.architecture in FLASHINFER_FUSION_ARCHITECTURES
            and self.hw.compute_capability.split(".")[0] in ("9", "10")
            and s.tp_size > 1
            and s.moe_a2a_backend == "none"
        )

    @property
    def uses_mla(self) -> bool:
        return not self.model.kv_sharded_by_tp  # an MLA latent cache is the one every rank holds whole

    @property
    def prefill_graph_backend(self) -> str:
        """The prefill graph backend: the flag, else tc_piecewise for MLA models (as SGLang resolved
        Kimi-K2.5, B12) and breakable otherwise (`default_prefill_backend`, cuda_graph_config.py:113)."""
        explicit = self.settings.prefill_cuda_graph_backend
        return explicit or ("tc_piecewise" if self.uses_mla else "breakable")

    # -- memory ---------------------------------------------------------------------------------------
    def kv_bytes_per_token(self) -> float:
        return memory.kv_bytes_per_token(self)

    # -- failures -------------------------------------------------------------------------------------
    def oom_under_load_lines(self, prefill_tokens: int) -> list[str]:
        """What a scheduler prints when a prefill batch's activations overflow what is left."""
        return failures.oom_under_load_lines(self, prefill_tokens)

    # -- timings --------------------------------------------------------------------------------------
    @property
    def init_seconds(self) -> float:
        return timing.init_seconds(self)

    @property
    def load_seconds(self) -> float:
        return timing.load_seconds(self)

    @property
    def prefill_capture_seconds(self) -> float:
        return timing.prefill_capture_seconds(self)

    @property
    def capture_seconds(self) -> float:
        return timing.capture_seconds(self)

    def allreduce_us(self, nbytes: float, in_graph: bool) -> float:
        """One tensor-parallel all-reduce as SGLang dispatches it: custom first, then NCCL. Remembered per
        size: a launch's settings do not change, and a workload's steps ask for the same few sizes."""
        key = (nbytes, in_graph)
        if key not in self._allreduce_us:
            self._allreduce_us[key] = timing.allreduce_us(self, nbytes, in_graph)
        return self._allreduce_us[key]

    def forward_s(
        self, tokens: int, context_tokens: int, in_graph: bool, routed_tokens: float | None = None
    ) -> float:
        """One target-model forward over `tokens` new tokens attending to `context_tokens` in all."""
        return timing.forward_s(self, tokens, context_tokens, in_graph, routed_tokens)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` requests; with speculation, draft + verify + draft extend."""
        return timing.decode_step_s(self, batch, context_tokens)

    def verify_allreduce_s(self, batch: int) -> float:
        """Time the verify pass spends in all-reduces at `batch` (0 without speculation)."""
        return timing.verify_allreduce_s(self, batch)

    def prefill_step_s(self, tokens: int, context_tokens: int) -> float:
        """One prefill (extend) batch of `tokens` new tokens."""
        return timing.prefill_step_s(self, tokens, context_tokens)

    def new_engine(self, seed: int = 0, noise: SimNoise | float = 0.0) -> Engine:
        """A scheduler for this launch, in model time, with its run-to-run noise (autotune.sim.model.noise;
        a number is a spread, 0.03 = 3%)."""
        from autotune.sim.engine import Engine

        return Engine(self, seed=seed, noise=noise)
