"""A simulated SGLang server, 0.5.17 or 0.5.23: `python -m autotune.sim.sglang_server [sglang serve flags]`.

It stands in for `sglang serve` (`python -m sglang.launch_server`) with the same command line: it parses
SGLang's flags (argparse's exit 2 on an unknown one), prints SGLang's startup log with real-time pauses, dies
with SGLang's exact fatal lines and exit status, serves SGLang's HTTP API, and generates fake tokens at the
pace the performance model (`autotune.sim.model`) gives for the launch settings and NCCL environment.

Simulator-only settings come from the environment:

- `SGLANG_SIM_VERSION`: the SGLang release to emulate, `0.5.17` (default) or `0.5.23`: its flags, its log
  wording and its behaviour (`autotune.sim.versions`).
- `SGLANG_SIM_HARDWARE`: hardware profile name or YAML path (default `rtx-pro-6000-pcie-x8`).
- `SGLANG_SIM_MODEL`: model profile name or YAML path (default `kimi-k2.5-int4`).
- `SGLANG_SIM_TIME_SCALE`: positive float, default 1.0; every modelled duration (init, weight loading,
  graph capture, each scheduler step) lasts its model length times this in real time. 0.001 makes a
  ten-minute weight load take 0.6 s.
- `SGLANG_SIM_STARTUP_TIME_SCALE`: the scale of start-up alone (init, weight loading, graph capture),
  default `SGLANG_SIM_TIME_SCALE`. Start-up does not enter the benchmark, so it can run faster than
  serving, whose client-side overhead grows relative to a fast clock (about 4% at 0.05, 10% at 0.01).
- `SGLANG_SIM_SEED`: integer seed of the run-to-run noise (default: `--random-seed`, else a fresh seed per
  launch, as two launches of a real server differ).
- `SGLANG_SIM_NOISE`: relative run-to-run spread of step times, e.g. 0.03 (default 0: deterministic).
- `SGLANG_SIM_FAULT`: comma-separated test faults: `hang_load` (weight loading stops making progress at
  about 19% and the server never becomes ready), `crash_benchmark[:N]` (after N tokens generated once the
  server is ready, default 200, it logs a CUDA error and dies with `os._exit(1)`), `slow_health`
  (`/health` and `/health_generate` take 2 real seconds to answer), `linger` (after a fatal line the
  process stays alive and stops answering, as the seed's server did, instead of killing its tree).
- `SGLANG_SIM_FORCE_CUSTOM_ALLREDUCE=1` and `NCCL_*`: read by the model from the environment, after the
  defaults SGLang sets itself when they are unset (`NCCL_CUMEM_ENABLE`, `NCCL_NVLS_ENABLE`; see
  `sglang_environment`).

Conventions. Durations the server reports (log lines, `e2e_latency`, `last_gen_throughput`) are in model
time, what the real node would report; a client's own clock sees them multiplied by the time scale, which
`/get_server_info` returns as `time_scale`. SGLang's warm-up waits one real second (a host-side sleep, not
GPU work) before its first request, so that wait is not scaled. The fake tokenizer counts one token per
whitespace-separated word of a text prompt; `input_ids` count as given. There is no EOS: every request
generates exactly its `max_new_tokens`.

Fidelity of measured throughput: a client measures wall time, which includes its own HTTP overhead
(about a millisecond per request and a little per chunk) magnified by 1 / time scale. At 0.05 a
benchmark of the default launch lands within about 4% of the model's answer, at 0.01 within about 10%;
0.001 is for startup and failure tests, not for throughput.

Exit statuses: 0 after SIGTERM or SIGINT; -9 (SIGKILL of itself, as SGLang's launcher kills its own
tree) after a startup failure or an out-of-memory under load; 1 for `crash_benchmark`, for a `ValueError`
SGLang raises while handling its arguments, and for a bad simulator setting; 2 for an argparse error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any, NoReturn

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from aiohttp.abc import AbstractAccessLogger

from autotune.errors import ConfigError
from autotune.sim.engine import input_too_long
from autotune.sim.logfmt import ERROR, INFO, WARNING, SimLog, rank_prefix, tqdm_line
from autotune.sim.model import LaunchSettings, NodeModel
from autotune.sim.predictability import predictability
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.sim.server_args import (
    CudaGraphConfig,
    PhaseConfig,
    build_parser,
    check_server_args,
    server_args_repr,
)
from autotune.sim.versions import DEFAULT_VERSION, VERSIONS, SglangVersion, sglang_version

DEFAULT_HARDWARE = "rtx-pro-6000-pcie-x8"
DEFAULT_MODEL = "kimi-k2.5-int4"
FAULTS = ("hang_load", "crash_benchmark", "slow_health", "linger")
DEFAULT_CRASH_AFTER_TOKENS = 200
SLOW_HEALTH_S = 2.0
HANG_LOAD_FRACTION = 0.19  # where the seed's log stopped: shard 12 of 64
WARMUP_WAIT_S = 1.0  # SGLang's _wait_and_warmup sleeps a second before its first /get_model_info
WARMUP_PROMPT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling-params default
OPENAI_COMPLETION_MAX_TOKENS = 16  # the OpenAI completions default
IDLE_STEP_S = 0.001  # a step that did nothing: yield a little wall time instead of spinning
MAX_BUSY_S = 0.002  # longest the engine loop keeps the event loop when it is behind schedule
SHUTDOWN_TIMEOUT_S = 1.0
FAKE_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
    "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "model", "token", "server", "batch", "graph",
)  # fmt: skip


@dataclass(frozen=True)
class SimOptions:
    """The simulator-only settings, read from `SGLANG_SIM_*` environment variables."""

    hardware: str = DEFAULT_HARDWARE
    model: str = DEFAULT_MODEL
    time_scale: float = 1.0
    startup_time_scale: float = 1.0
    seed: int = 0
    noise: float = 0.0
    faults: frozenset[str] = frozenset()
    crash_after_tokens: int = DEFAULT_CRASH_AFTER_TOKENS
    version: SglangVersion = VERSIONS[DEFAULT_VERSION]

    @classmethod
    def from_env(cls, env: Mapping[str, str], default_seed: int | None = None) -> SimOptions:
        """Parse the environment; a malformed value is a `ConfigError` naming the variable and the fix."""
        scale = _env_number(env, "SGLANG_SIM_TIME_SCALE", 1.0, float)
        if scale <= 0:
            raise _env_error("SGLANG_SIM_TIME_SCALE", scale, "must be positive", "Use e.g. 1.0 or 0.001.")
        startup = _env_number(env, "SGLANG_SIM_STARTUP_TIME_SCALE", scale, float)
        if startup <= 0:
            raise _env_error(
                "SGLANG_SIM_STARTUP_TIME_SCALE", startup, "must be positive", "Use e.g. 0.005 or unset it."
            )
        noise = _env_number(env, "SGLANG_SIM_NOISE", 0.0, float)
        if not 0 <= noise < 1:
            raise _env_error("SGLANG_SIM_NOISE", noise, "must be in [0, 1)", "Use e.g. 0.03 for 3%.")
        fresh = default_seed if default_seed is not None else int.from_bytes(os.urandom(4), "little")
        seed = int(_env_number(env, "SGLANG_SIM_SEED", fresh, int))
        faults, crash_after = _parse_faults(env.get("SGLANG_SIM_FAULT", ""))
        return cls(
            hardware=env.get("SGLANG_SIM_HARDWARE") or DEFAULT_HARDWARE,
            model=env.get("SGLANG_SIM_MODEL") or DEFAULT_MODEL,
            time_scale=scale,
            startup_time_scale=startup,
            seed=seed,
            noise=noise,
            faults=faults,
            crash_after_tokens=crash_after,
            version=sglang_version(env),
        )


def _env_error(name: str, value: object, problem: str, fix: str) -> ConfigError:
    return ConfigError("environment", name, value, problem, fix)


def _env_number(env: Mapping[str, str], name: str, default: float, kind: type[float] | type[int]) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise _env_error(name, raw, f"is not {'an integer' if kind is int else 'a number'}", "") from None


def _parse_faults(raw: str) -> tuple[frozenset[str], int]:
    faults: set[str] = set()
    crash_after = DEFAULT_CRASH_AFTER_TOKENS
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, arg = item.partition(":")
        if name not in FAULTS:
            raise _env_error("SGLANG_SIM_FAULT", item, "names no known fault", f"Use one of {list(FAULTS)}.")
        if arg:
            if name != "crash_benchmark" or not arg.isdigit():
                raise _env_error(
                    "SGLANG_SIM_FAULT", item, "has an argument it cannot take", "Only crash_benchmark:N does."
                )
            crash_after = int(arg)
        faults.add(name)
    return frozenset(faults), crash_after


def __getattr__(name: str) -> str:
    """`__version__`, what the node check reads as the SGLang version: the one `SGLANG_SIM_VERSION` selects
    (a bad value is the `ConfigError` naming it, so the node check reports it)."""
    if name == "__version__":
        return sglang_version(os.environ).name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- fake tokenizer ----------------------------------------------------------------------------------------
def fake_token_id(position: int) -> int:
    """The id of the `position`-th generated token of any request: deterministic, never special."""
    return 1000 + (position * 7919) % 30000


def fake_token_text(token_id: int) -> str:
    return " " + FAKE_WORDS[token_id % len(FAKE_WORDS)]


def count_text_tokens(text: str) -> int:
    """The fake tokenizer: one token per whitespace-separated word, at least one."""
    return max(1, len(text.split()))


# -- resolved arguments ------------------------------------------------------------------------------------
def resolved_server_args(ns: argparse.Namespace, node: NodeModel, seed: int) -> dict[str, Any]:
    """The arguments as SGLang holds them after `ServerArgs.__post_init__`: automatic values filled in."""
    values = {k: v for k, v in vars(ns).items() if k not in ("deprecation_warnings", "sglang_version")}
    plan = node.plan
    values["tokenizer_path"] = ns.tokenizer_path or ns.model_path
    values["served_model_name"] = ns.served_model_name or ns.model_path
    values["mem_fraction_static"] = plan.mem_fraction_static
    values["chunked_prefill_size"] = (
        ns.chunked_prefill_size if ns.chunked_prefill_size is not None else plan.chunked_prefill_size
    )
    graphs = CudaGraphConfig(
        decode=PhaseConfig(
            backend="disabled"
            if node.settings.disable_cuda_graph
            else ns.cuda_graph_backend_decode or "full",
            max_bs=plan.cuda_graph_max_bs,
            bs=plan.captured_batch_sizes or None,
        ),
        prefill=PhaseConfig(
            backend=node.prefill_graph_backend if node.settings.prefill_cuda_graph else "disabled",
            max_bs=node.plan.prefill_graph_max_tokens,
            bs=node.plan.prefill_graph_sizes or None,
        ),
    )
    # ServerArgs declares cuda_graph_config just before the per-phase flags (server_args.py:1799).
    at = list(values).index("cuda_graph_backend_decode")
    items = list(values.items())
    values = dict([*items[:at], ("cuda_graph_config", graphs), *items[at:]])
    values["page_size"] = ns.page_size if ns.page_size is not None else 1
    values["random_seed"] = ns.random_seed if ns.random_seed is not None else seed
    values["device"] = ns.device or "cuda"
    values["attention_backend"] = ns.attention_backend or node.attention_backend
    if ns.moe_a2a_backend in ("deepep", "mooncake"):
        values["ep_size"] = ns.tp_size
    if ns.speculative_algorithm is not None:
        values["max_running_requests"] = ns.max_running_requests or 48  # spec v2 keeps overlap (B1)
    if ns.speculative_algorithm == "NEXTN":
        values["speculative_algorithm"] = "EAGLE"
    if node.spec is not None:
        values["speculative_num_steps"] = node.spec.num_steps
        values["speculative_eagle_topk"] = node.spec.topk
        values["speculative_num_draft_tokens"] = node.spec.num_draft_tokens
    return values


def sglang_environment(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """The environment SGLang's ranks run with: `_set_envs_and_config` (engine.py:1582-1591, [23] 1898-1916)
    sets the two NCCL variables only where they are unset (or a symmetric-memory/NVLS flag asks), so a tuned
    `NCCL_CUMEM_ENABLE` takes effect."""
    ran_with = dict(env)
    if ns.enable_symm_mem or "NCCL_CUMEM_ENABLE" not in env:
        ran_with["NCCL_CUMEM_ENABLE"] = str(int(ns.enable_symm_mem))
    if ns.enable_nccl_nvls or ns.enable_symm_mem or "NCCL_NVLS_ENABLE" not in env:
        ran_with["NCCL_NVLS_ENABLE"] = str(int(ns.enable_nccl_nvls or ns.enable_symm_mem))
    ran_with["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    ran_with["CUDA_MODULE_LOADING"] = "AUTO"
    return ran_with


# -- requests in flight ------------------------------------------------------------------------------------
@dataclass
class _Request:
    """One generation the engine runs: its token deliveries arrive on `queue` (None = finished)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    started: float
    queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    verify_ct: int = 0
    abort_message: str | None = None
    finished_at: float | None = None


@dataclass
class _Chunk:
    """What one streamed delivery carries: the new token ids and whether the request is done."""

    new_ids: list[int]
    finished: bool


class _BadRequest(Exception):
    """A request SGLang answers with 400 and this message."""


SIM_KEY = web.AppKey("sim", object)


class _UvicornAccessLogger(AbstractAccessLogger):
    """Access lines in uvicorn's format, as SGLang's log shows them."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        server = request.app[SIM_KEY] if isinstance(request, web.Request) else None
        if not isinstance(server, SimulatedServer):
            return
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = ""
        line = f"{request.method} {request.path_qs} HTTP/{request.version.major}.{request.version.minor}"
        server.log.uvicorn(f'{client} - "{line}" {response.status} {phrase}')


class SimulatedServer:
    """One simulated SGLang launch: startup phases, the HTTP API, and the engine loop in real time."""

    def __init__(self, ns: argparse.Namespace, node: NodeModel, options: SimOptions, log: SimLog) -> None:
        self.ns = ns
        self.node = node
        self.plan = node.plan
        self.options = options
        self.log = log
        self.scale = options.time_scale
        self.startup_scale = options.startup_time_scale
        self.args = resolved_server_args(ns, node, options.seed)
        self.ranks = self._rank_prefixes()
        self.engine = node.new_engine(seed=options.seed, noise=options.noise)
        self.requests: dict[str, _Request] = {}
        self.ready = False
        self.tokens_after_ready = 0
        self.last_gen_throughput = 0.0
        self._work = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._decode_steps = 0
        self._interval_tokens = 0
        self._interval_model_s = 0.0

    # -- process lifecycle --------------------------------------------------------------------------------
    async def run(self) -> int:
        """Start, serve until SIGTERM or SIGINT, and return the exit status (a fatal error never returns)."""
        loop = asyncio.get_running_loop()
        lifecycle = asyncio.current_task()
        assert lifecycle is not None  # run() is awaited by asyncio.run
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, lifecycle.cancel)
        engine_task: asyncio.Task[None] | None = None
        try:
            await self._startup()
            engine_task = asyncio.create_task(self._engine_loop())
            await self._start_http()
            await self._warmup()
            self.ready = True
            self.log.info("The server is fired up and ready to roll!")
            await asyncio.Event().wait()  # serve until a signal cancels this task
        except asyncio.CancelledError:
            pass
        finally:
            if engine_task is not None:
                engine_task.cancel()
            await self._stop_http()
        return 0

    def _rank_prefixes(self) -> list[tuple[int, str]]:
        """(tp_rank, log prefix) of every scheduler process, in rank order."""
        ns = self.ns
        tp, dp = ns.tp_size, ns.dp_size
        ep = tp if ns.moe_a2a_backend in ("deepep", "mooncake") else ns.ep_size
        if ns.enable_dp_attention:
            # DP attention splits the TP group: scheduler rank r serves attention DP rank r // (tp / dp).
            return [(r, rank_prefix(r, tp, r // max(tp // dp, 1), dp, ep)) for r in range(tp)]
        return [(r, rank_prefix(r, tp, d, dp, ep)) for d in range(dp) for r in range(tp)]

    def _all_ranks(self, message: str, warning: bool = False) -> None:
        for _, prefix in self.ranks:
            self.log.log(message, prefix, WARNING if warning else INFO)

    def _rank0(self, message: str) -> None:
        self.log.info(message, self.ranks[0][1])

    def _prefix_of(self, tp_rank: int) -> str:
        for rank, prefix in self.ranks:
            if rank == tp_rank:
                return prefix
        return self.ranks[0][1]

    async def _sleep_model(self, seconds: float) -> None:
        """Sleep through a start-up phase of `seconds` model time."""
        if seconds > 0:
            await asyncio.sleep(seconds * self.startup_scale)

    def _die(self, tp_rank: int, lines: list[str]) -> NoReturn:
        """A scheduler raised: log its traceback, the launcher's reaction, and kill this process tree."""
        traceback = (
            lines
            if lines and lines[0].startswith("Traceback")
            else ["Traceback (most recent call last):", *lines]
        )
        # One logging record: only its first line carries the date and rank; it ends with a newline.
        message = "\n".join([f"Scheduler hit an exception: {traceback[0]}", *traceback[1:], ""])
        self.log.error(message, self._prefix_of(tp_rank))
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        self._linger_if_asked()
        os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(-9)  # unreachable: SIGKILL cannot be caught

    # -- startup ------------------------------------------------------------------------------------------
    async def _startup(self) -> None:
        for note in self.node.notes:
            self.log.info(note)
        self.log.info(f"server_args={server_args_repr(self.args, self.options.version)}")
        failure = self.node.startup_failure
        phase = failure.phase if failure else None
        await self._init_distributed(fail=phase == "init")
        await self._load_weights(fail=phase == "load")
        if phase == "kv" and failure:
            self._die(failure.rank, failure.lines)
        self._allocate_kv_cache()
        if phase == "runner" and failure:
            self._die(failure.rank, failure.lines)
        await self._capture_cuda_graphs(fail=phase == "capture")
        await self._capture_prefill_graphs(fail=phase == "prefill_capture")
        plan, chunked = self.plan, self.args["chunked_prefill_size"]
        self._all_ranks(
            f"max_total_num_tokens={plan.kv_tokens}, chunked_prefill_size={chunked}, "
            f"max_prefill_tokens={plan.max_prefill_tokens}, "
            f"max_running_requests={plan.max_running_requests}, "
            f"context_len={plan.context_len}, available_gpu_mem={plan.avail_after_graph_gb:.2f} GB"
        )

    def _fail_here(self) -> NoReturn:
        failure = self.node.startup_failure
        assert failure is not None  # only called for the failure's own phase
        self._die(failure.rank, failure.lines)

    async def _init_distributed(self, fail: bool) -> None:
        plan = self.plan
        self._all_ranks("Init torch distributed begin.")
        for warning in self.node.warnings:
            self._all_ranks(warning, warning=True)
        if fail:
            await self._sleep_model(self.node.init_seconds / 2)
            self._fail_here()
        await self._sleep_model(self.node.init_seconds)
        init_usage = plan.init_used_gb - self.node.hw.cuda_context_gb
        elapsed = self.node.init_seconds
        self._all_ranks(
            f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={init_usage:.2f} GB"
        )

    async def _load_weights(self, fail: bool) -> None:
        plan, model = self.plan, self.node.model
        self._all_ranks(f"Load weight begin. avail mem={plan.total_gb - plan.init_used_gb:.2f} GB")
        if fail:
            self._fail_here()
        shards = model.num_shards
        per_shard = self.node.load_seconds / shards
        desc = "Loading safetensors checkpoint shards"
        self.log.raw(tqdm_line(desc, 0, shards, 0.0))
        hang_at = int(shards * HANG_LOAD_FRACTION) if "hang_load" in self.options.faults else None
        for done in range(1, shards + 1):
            if done == hang_at:
                await asyncio.Event().wait()  # no progress, no error: only a timeout catches this
            await self._sleep_model(per_shard)
            self.log.raw(tqdm_line(desc, done, shards, done * per_shard))
        quant = f"quant={model.quantization}, " if model.quantization else ""  # model_runner.py:1097-1106
        self._all_ranks(
            f"Load weight end. elapsed={self.node.load_seconds:.2f} s, type={model.architecture}, {quant}"
            f"avail mem={plan.avail_after_weights_gb:.2f} GB, mem usage={plan.weights_gb:.2f} GB."
        )

    def _allocate_kv_cache(self) -> None:
        plan = self.plan
        if self.node.model.kv_sharded_by_tp:
            sizes = f"K size: {plan.kv_gb / 2:.2f} GB, V size: {plan.kv_gb / 2:.2f} GB"
        else:
            sizes = f"KV size: {plan.kv_gb:.2f} GB"  # MLA keeps one latent cache, and SGLang says so
        dtype = (
            "torch.float8_e4m3fn" if self.node.settings.kv_cache_dtype.startswith("fp8") else "torch.bfloat16"
        )
        self._all_ranks(f"KV Cache is allocated. dtype: {dtype}, #tokens: {plan.kv_tokens}, {sizes}")
        self._all_ranks(f"Memory pool end. avail mem={plan.avail_after_kv_gb:.2f} GB")

    async def _capture_cuda_graphs(self, fail: bool) -> None:
        """The decode graphs (cuda_graph_setup.py:429-456, [23] 759-792): `bs=` at begin in 0.5.17, at end in
        0.5.23; `target verify` with speculation."""
        plan = self.plan
        sizes = plan.captured_batch_sizes
        if not sizes and not fail:
            return
        name = "target verify" if self.node.spec else "target decode"
        tokens = self.node.spec.num_draft_tokens if self.node.spec else 1
        at_end = self.options.version.capture_bs_at_end
        self._all_ranks(
            f"Capture {name} CUDA graph begin. backend={self.args['cuda_graph_config'].decode.backend}, "
            f"num_tokens_per_req={tokens}, {'' if at_end else f'bs={sizes}, '}"
            f"avail mem={plan.avail_after_kv_gb:.2f} GB"
        )
        if fail:
            await self._sleep_model(self.node.capture_seconds / max(len(sizes), 1))
            self._fail_here()
        await self._sleep_model(self.node.capture_seconds)
        self._all_ranks(
            f"Capture {name} CUDA graph end. {f'bs={sizes}, ' if at_end else ''}"
            f"elapsed={self.node.capture_seconds:.2f} s, mem usage={plan.graph_gb:.2f} GB, "
            f"avail mem={plan.avail_after_kv_gb - plan.graph_gb:.2f} GB."
        )

    async def _capture_prefill_graphs(self, fail: bool) -> None:
        """The prefill graphs, a second capture with its own memory (cuda_graph_setup.py:362-366)."""
        plan = self.plan
        if not plan.prefill_graph_sizes:
            return
        before = plan.avail_after_kv_gb - plan.graph_gb
        self._all_ranks(
            f"Capture target prefill CUDA graph begin. backend={self.node.prefill_graph_backend}, "
            f"num_tokens={plan.prefill_graph_sizes}, avail mem={before:.2f} GB"
        )
        seconds = self.node.prefill_capture_seconds
        if fail:
            await self._sleep_model(seconds / 2)
            self._fail_here()
        await self._sleep_model(seconds)
        self._all_ranks(
            f"Capture target prefill CUDA graph end. elapsed={seconds:.2f} s, "
            f"mem usage={plan.prefill_graph_gb:.2f} GB, avail mem={plan.avail_after_graph_gb:.2f} GB."
        )

    # -- HTTP server --------------------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._api_key_middleware])
        app[SIM_KEY] = self
        app.add_routes(
            [
                web.get("/health", self.handle_health),
                web.get("/health_generate", self.handle_health),
                web.get("/get_model_info", self.handle_model_info),
                web.get("/model_info", self.handle_model_info),
                web.get("/get_server_info", self.handle_get_server_info),
                web.get("/server_info", self.handle_server_info),
                web.post("/flush_cache", self.handle_flush_cache),
                web.get("/flush_cache", self.handle_flush_cache),
                web.post("/generate", self.handle_generate),
                web.get("/v1/models", self.handle_models),
                web.post("/v1/completions", self.handle_completions),
                web.post("/v1/chat/completions", self.handle_chat_completions),
            ]
        )
        return app

    @web.middleware
    async def _api_key_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # As SGLang 0.5.17 srt/utils/auth.py decide_request_auth: with --api-key every path but /health*
        # and /metrics* needs `Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"}.
        key = self.ns.api_key
        if key and not request.path.startswith(("/health", "/metrics")):
            if request.headers.get("Authorization") != f"Bearer {key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _start_http(self) -> None:
        runner = web.AppRunner(
            self._build_app(), access_log_class=_UvicornAccessLogger, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        self._runner = runner
        self.log.uvicorn(f"Started server process [{os.getpid()}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        try:
            await web.TCPSite(runner, self.ns.host, self.ns.port).start()
        except OSError as exc:
            self.log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"('{self.ns.host}', {self.ns.port}): {(exc.strerror or str(exc)).lower()}",
                ERROR,
            )
            sys.stderr.flush()
            os._exit(1)  # uvicorn exits with 1 when it cannot bind
        self.log.uvicorn(f"Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)")

    async def _stop_http(self) -> None:
        if self._runner is None:
            return
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")
        runner, self._runner = self._runner, None
        await runner.cleanup()
        self.log.uvicorn(f"Finished server process [{os.getpid()}]")

    def _base_url(self) -> str:
        host = self.ns.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"  # a wildcard bind is reached through loopback, as SGLang's warm-up does
        return f"http://[{host}]:{self.ns.port}" if ":" in host else f"http://{host}:{self.ns.port}"

    async def _warmup(self) -> None:
        """SGLang's `_wait_and_warmup`: wait a second, ask /get_model_info, then generate a few tokens."""
        if self.ns.skip_server_warmup:
            return
        await asyncio.sleep(WARMUP_WAIT_S)
        failure = self.node.startup_failure
        headers = {"Authorization": f"Bearer {self.ns.api_key}"} if self.ns.api_key else {}
        body = {
            "text": WARMUP_PROMPT,
            "sampling_params": {"temperature": 0, "max_new_tokens": WARMUP_MAX_NEW_TOKENS},
        }
        try:
            async with ClientSession(timeout=ClientTimeout(total=600), headers=headers) as session:
                async with session.get(self._base_url() + "/get_model_info") as response:
                    response.raise_for_status()
                if failure is not None and failure.phase == "warmup":
                    self._die(failure.rank, failure.lines)
                async with session.post(self._base_url() + "/generate", json=body) as response:
                    response.raise_for_status()
                    await response.read()
        except (TimeoutError, ClientError) as exc:
            self.log.error(f"Initialization failed. warmup error: {exc!r}")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    # -- engine loop --------------------------------------------------------------------------------------
    def submit(
        self, prompt_tokens: int, max_new_tokens: int, rid: str | None = None, predictability: float = 0.0
    ) -> _Request:
        """Queue one generation on the engine and return the request its tokens will be delivered to."""
        context_len = self.plan.context_len
        if prompt_tokens >= context_len:
            raise _BadRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({context_len} tokens)."
            )
        if prompt_tokens + max_new_tokens >= context_len:
            raise _BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
                f"You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        rid = rid or uuid.uuid4().hex
        if rid in self.requests:
            raise _BadRequest(f"Duplicate request ID: {rid}")
        request = _Request(rid, prompt_tokens, max_new_tokens, started=time.monotonic())
        self.requests[rid] = request
        self.engine.add(rid, prompt_tokens, max_new_tokens, predictability)
        self._work.set()
        return request

    async def _engine_loop(self) -> None:
        """Step the engine while it has work, each step ending at its absolute wall-clock deadline."""
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            anchor, model_clock = loop.time(), 0.0
            last_yield = anchor
            while self.engine.has_work:
                step = self.engine.step()
                if step.oom_lines:
                    self._die(0, step.oom_lines)
                model_clock += step.duration_s
                delay = anchor + model_clock * self.scale - loop.time()
                if not (step.emitted or step.finished or step.aborted) and step.duration_s == 0:
                    delay = max(delay, IDLE_STEP_S)
                if delay > 0 or loop.time() - last_yield > MAX_BUSY_S:
                    # Behind schedule, steps run back to back and writers coalesce their tokens, as
                    # SGLang's are when clients are slow; yielding now and then keeps the HTTP side alive.
                    await asyncio.sleep(max(delay, 0.0))
                    last_yield = loop.time()
                self._deliver(step.kind, step.emitted, step.finished, step.aborted, step.duration_s)
                if step.kind == "prefill" and step.emitted:
                    await asyncio.sleep(0)  # first tokens go out on their own, so time to first token holds
                    last_yield = loop.time()
            self._work.clear()

    def _deliver(
        self, kind: str, emitted: dict[str, int], finished: list[str], aborted: list[str], duration_s: float
    ) -> None:
        for rid, count in emitted.items():
            request = self.requests.get(rid)
            if request is None:
                continue  # the client went away; the engine cannot abort, so its tokens are dropped
            request.generated += count
            if kind == "decode":
                request.verify_ct += 1
            request.queue.put_nowait(count)
        for rid in aborted:
            request = self.requests.get(rid)
            if request is not None:
                request.abort_message = input_too_long(request.prompt_tokens, self.plan)
        self._log_step(kind, emitted, duration_s)  # before finished requests leave `self.requests`
        for rid in [*finished, *aborted]:
            request = self.requests.pop(rid, None)
            if request is not None:
                request.finished_at = time.monotonic()
                request.queue.put_nowait(None)
        if self.ready and emitted:
            self.tokens_after_ready += sum(emitted.values())
            if "crash_benchmark" in self.options.faults:
                if self.tokens_after_ready >= self.options.crash_after_tokens:
                    self._crash()

    def _log_step(self, kind: str, emitted: dict[str, int], duration_s: float) -> None:
        stats = self.engine.stats
        if kind == "prefill" and emitted:
            new_tokens = sum(r.prompt_tokens for rid in emitted if (r := self.requests.get(rid)) is not None)
            self._rank0(
                f"Prefill batch. #new-seq: {len(emitted)}, #new-token: {new_tokens}, #cached-token: 0, "
                f"token usage: {stats['token_usage']:.2f}, #running-req: {int(stats['running'])}, "
                f"#queue-req: {int(stats['queued'])}, "
            )
            return
        if kind != "decode" or not emitted:
            return
        self._decode_steps += 1
        self._interval_tokens += sum(emitted.values())
        self._interval_model_s += duration_s
        if self._decode_steps % self.ns.decode_log_interval:
            return
        self.last_gen_throughput = (
            self._interval_tokens / self._interval_model_s if self._interval_model_s else 0.0
        )
        self._interval_tokens, self._interval_model_s = 0, 0.0
        running = int(stats["running"])
        message = (
            f"Decode batch [{self._decode_steps}], #running-req: {running}, #token: {int(stats['tokens'])}, "
            f"token usage: {stats['token_usage']:.2f}, "
        )
        if self.node.spec is not None:
            accept = stats["avg_accept_length"]
            drafts = self.node.spec.num_draft_tokens
            rate = (accept - 1) / (drafts - 1) if drafts > 1 else 0.0
            message += f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
        in_graph = not self.ns.disable_cuda_graph and running <= self.plan.cuda_graph_max_bs
        message += (
            f"cuda graph: {in_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {int(stats['queued'])}, "
        )
        self._rank0(message)

    def _crash(self) -> NoReturn:
        """`crash_benchmark`: a CUDA error kills the scheduler mid-benchmark and the process with it."""
        lines = [
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 1024, '
            "in event_loop_normal",
            "    result = self.run_batch(batch)",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "CUDA kernel errors might be asynchronously reported at any other API call, so the stacktrace "
            "below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            "",
        ]
        self.log.error("Scheduler hit an exception: " + "\n".join(lines), self.ranks[0][1])
        sys.stderr.flush()
        self._linger_if_asked()
        os._exit(1)

    def _linger_if_asked(self) -> None:
        """`linger`: stay alive without answering (the event loop blocks) until SIGTERM ends the process."""
        if "linger" in self.options.faults:
            sys.stderr.flush()
            while True:
                time.sleep(3600)

    async def _chunks(self, request: _Request) -> AsyncIterator[_Chunk]:
        """Deliveries for one streaming client, coalescing what piled up and honouring --stream-interval."""
        sent = pending = 0
        interval = max(1, self.ns.stream_interval)
        while True:
            items = [await request.queue.get()]
            while not request.queue.empty():
                items.append(request.queue.get_nowait())
            finished = None in items
            pending += sum(item for item in items if item is not None)
            # SGLang streams the first token at once (TTFT), then every stream_interval tokens.
            if finished or pending >= interval or (sent == 0 and pending > 0):
                yield _Chunk([fake_token_id(i) for i in range(sent, sent + pending)], finished)
                sent += pending
                pending = 0
            if finished:
                return

    async def _collect(self, request: _Request) -> list[int]:
        ids: list[int] = []
        async for chunk in self._chunks(request):
            ids.extend(chunk.new_ids)
        return ids

    def _abandon(self, request: _Request) -> None:
        self.requests.pop(request.rid, None)

    def _meta_info(self, request: _Request, completion_tokens: int, finished: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": None,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": completion_tokens,
            "cached_tokens": 0,
        }
        if finished:
            if request.abort_message is not None:
                meta["finish_reason"] = {
                    "type": "abort",
                    "message": request.abort_message,
                    "status_code": 400,
                    "err_type": "BadRequestError",
                }
            else:
                meta["finish_reason"] = {"type": "length", "length": completion_tokens}
            end = request.finished_at or time.monotonic()
            meta["e2e_latency"] = (end - request.started) / self.scale
        if self.node.spec is not None:
            meta["spec_verify_ct"] = request.verify_ct
            # completion_tokens / verify_ct, the prefill's token included (tokenizer_manager.py:2767-2769).
            meta["spec_accept_length"] = completion_tokens / request.verify_ct if request.verify_ct else 0.0
        return meta

    # -- handlers -----------------------------------------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        if "slow_health" in self.options.faults:
            await asyncio.sleep(SLOW_HEALTH_S)
        if not self.engine.has_work:
            # Idle: SGLang proves health by generating one token; busy, the running batch proves it.
            health = self.submit(1, 1, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}")
            await self._collect(health)
        return web.Response(status=200)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.ns.model_path,
                "tokenizer_path": self.args["tokenizer_path"],
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": None,
                "architectures": [self.node.model.architecture],
            }
        )

    async def handle_get_server_info(self, request: web.Request) -> web.Response:
        # http_server.py:771-778: the old name still answers, with a warning per call.
        self.log.warning(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        return await self.handle_server_info(request)

    async def handle_server_info(self, request: web.Request) -> web.Response:
        stats = self.engine.stats
        state: dict[str, Any] = {
            "last_gen_throughput": self.last_gen_throughput or stats["last_gen_throughput"],
            "memory_usage": {
                "weight": round(self.plan.weights_gb, 2),
                "kvcache": round(max(self.plan.kv_gb, 0.0), 2),
                "token_capacity": self.plan.kv_tokens,
                "graph": round(self.plan.graph_gb, 2),
            },
        }
        if self.node.spec is not None:
            state["avg_spec_accept_length"] = stats["avg_accept_length"]
        dp_states = 1 if not self.ns.enable_dp_attention else max(self.ns.dp_size, 1)
        info = {
            **{k: asdict(v) if isinstance(v, CudaGraphConfig) else v for k, v in self.args.items()},
            "max_total_num_tokens": self.plan.kv_tokens,
            "max_req_input_len": min(self.plan.context_len, self.plan.kv_tokens) - 1,
            "internal_states": [dict(state) for _ in range(dp_states)],
            "version": self.options.version.name,
            "time_scale": self.scale,
            "simulator": {
                "hardware": self.node.hw.name,
                "model": self.node.model.name,
                "seed": self.options.seed,
                "noise": self.options.noise,
            },
        }
        return web.json_response(info)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        stats = self.engine.stats
        if self.engine.has_work:
            self.log.warning(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {int(stats['queued'])}, #running-req: {int(stats['running'])}",
                self.ranks[0][1],
            )
            status = 400
        else:
            self._rank0("Cache flushed successfully!")
            status = 200
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
            status=status,
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.args["served_model_name"],
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.args["served_model_name"],
                        "parent": None,
                        "max_model_len": self.plan.context_len,
                    }
                ],
            }
        )

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            prompt_tokens = _prompt_tokens(body.get("text"), body.get("input_ids"))
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise _BadRequest("sampling_params must be an object.")
            max_new = _non_negative_int(
                params.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS, "max_new_tokens"
            )
            rid = body.get("rid")
            text = body.get("text")
            job = self.submit(
                prompt_tokens,
                max_new,
                rid=str(rid) if rid is not None else None,
                predictability=predictability(text.split()) if isinstance(text, str) else 0.0,
            )
        except _BadRequest as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if body.get("stream"):
            return await self._stream_generate(request, job)
        ids = await self._collect(job)
        meta = self._meta_info(job, len(ids), finished=True)
        if job.abort_message is not None:
            return web.json_response({"error": {"message": job.abort_message}}, status=400)
        return web.json_response({"text": _text(ids), "output_ids": ids, "meta_info": meta})

    async def _stream_generate(self, request: web.Request, job: _Request) -> web.StreamResponse:
        response = await _open_event_stream(request)
        ids: list[int] = []
        try:
            async for chunk in self._chunks(job):
                ids.extend(chunk.new_ids)
                payload = {
                    "text": _text(ids),
                    "output_ids": list(ids),  # cumulative, as real non-incremental streaming sends (B13)
                    "meta_info": self._meta_info(job, len(ids), chunk.finished),
                }
                await _send_event(response, payload)
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            self._abandon(job)
        return response

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
                prompt_tokens = _prompt_tokens(None, prompt)
            elif isinstance(prompt, str):
                prompt_tokens = _prompt_tokens(prompt, None)
            else:
                raise _BadRequest(
                    "prompt must be a string or a list of token ids (batches are not simulated)."
                )
            limit = body.get("max_tokens")
            job = self.submit(
                prompt_tokens, _non_negative_int(limit, OPENAI_COMPLETION_MAX_TOKENS, "max_tokens")
            )
        except _BadRequest as exc:
            return _openai_error(str(exc))
        base = {"id": f"cmpl-{job.rid}", "object": "text_completion", "created": int(time.time())}
        base["model"] = self._model_name(body)
        if body.get("stream"):
            return await self._stream_openai(request, job, body, base, lambda text: {"text": text})
        return await self._complete_openai(job, base, lambda text: {"text": text})

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("messages must be a non-empty list.")
            # Each message costs its words plus the chat template's few role and separator tokens.
            prompt_tokens = sum(4 + count_text_tokens(_message_text(m)) for m in messages) + 2
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
            job = self.submit(prompt_tokens, _non_negative_int(limit, DEFAULT_MAX_NEW_TOKENS, "max_tokens"))
        except _BadRequest as exc:
            return _openai_error(str(exc))
        base = {"id": job.rid, "object": "chat.completion", "created": int(time.time())}
        base["model"] = self._model_name(body)
        if body.get("stream"):
            base["object"] = "chat.completion.chunk"
            opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            return await self._stream_openai(
                request, job, body, base, lambda text: {"delta": {"content": text}}, opening
            )
        message = {"role": "assistant", "reasoning_content": None, "tool_calls": None}
        return await self._complete_openai(job, base, lambda text: {"message": {**message, "content": text}})

    async def _complete_openai(
        self, job: _Request, base: dict[str, Any], content: Callable[[str], dict[str, Any]]
    ) -> web.Response:
        ids = await self._collect(job)
        if job.abort_message is not None:
            return _openai_error(job.abort_message)
        choice = {"index": 0, **content(_text(ids)), "logprobs": None, "finish_reason": "length"}
        choice["matched_stop"] = None
        return web.json_response({**base, "choices": [choice], "usage": _usage(job.prompt_tokens, len(ids))})

    async def _stream_openai(
        self,
        request: web.Request,
        job: _Request,
        body: dict[str, Any],
        base: dict[str, Any],
        content: Callable[[str], dict[str, Any]],
        opening: dict[str, Any] | None = None,
    ) -> web.StreamResponse:
        """OpenAI's streaming shape: one chunk per delivery, an optional usage chunk, then [DONE]."""
        response = await _open_event_stream(request)
        total = 0
        try:
            if opening is not None:
                await _send_event(response, {**base, "choices": [opening]})
            async for chunk in self._chunks(job):
                total += len(chunk.new_ids)
                finish = ("abort" if job.abort_message is not None else "length") if chunk.finished else None
                choice = {
                    "index": 0,
                    **content(_text(chunk.new_ids)),
                    "logprobs": None,
                    "finish_reason": finish,
                }
                choice["matched_stop"] = None
                await _send_event(response, {**base, "choices": [choice], "usage": None})
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                await _send_event(
                    response, {**base, "choices": [], "usage": _usage(job.prompt_tokens, total)}
                )
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            self._abandon(job)
        return response

    def _model_name(self, body: dict[str, Any]) -> str:
        name = body.get("model")
        return name if isinstance(name, str) and name else str(self.args["served_model_name"])


# -- request helpers ---------------------------------------------------------------------------------------
async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("The request body must be a JSON object.")
    return body


def _prompt_tokens(text: object, input_ids: object) -> int:
    if (text is None) == (input_ids is None):
        raise _BadRequest("Either text or input_ids should be provided.")
    if isinstance(text, str):
        return count_text_tokens(text)
    if isinstance(input_ids, list) and input_ids and all(isinstance(i, int) for i in input_ids):
        return len(input_ids)
    raise _BadRequest(
        "text must be a string and input_ids a non-empty list of ints (batches are not simulated)."
    )


def _non_negative_int(value: object, default: int, name: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _BadRequest(f"{name} must be a non-negative integer, got {value!r}.")
    return value


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        raise _BadRequest("Each message must be an object with a role and content.")
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _text(ids: list[int]) -> str:
    return "".join(fake_token_text(i) for i in ids)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
    }


def _openai_error(message: str) -> web.Response:
    payload = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return web.json_response(payload, status=400)


async def _open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _send_event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())


# -- entry point -------------------------------------------------------------------------------------------
def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)  # a stop before the event loop runs is still SGLang's clean shutdown


def main(argv: list[str] | None = None) -> int:
    """Run one simulated launch with SGLang's command line; return the exit status."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        version = sglang_version(os.environ)
    except ConfigError as exc:
        print(f"autotune.sim.sglang_server: {exc}", file=sys.stderr)
        return 1
    ns = build_parser(version).parse_args(argv)
    log = SimLog(sys.stderr, ns.log_level, ns.log_level_http)
    try:
        options = SimOptions.from_env(os.environ, default_seed=ns.random_seed)
        hardware = load_hardware_profile(options.hardware)
        model = load_model_profile(options.model)
    except ConfigError as exc:
        print(f"autotune.sim.sglang_server: {exc}", file=sys.stderr)
        return 1
    node = NodeModel(hardware, model, LaunchSettings.from_args(ns, sglang_environment(ns, os.environ)))
    # ServerArgs warns before logging is configured, so Python prints these bare; its errors propagate.
    for warning in check_server_args(ns, node.attention_backend):
        log.raw(warning, WARNING)
    return asyncio.run(_serve(ns, node, options, log))


async def _serve(ns: argparse.Namespace, node: NodeModel, options: SimOptions, log: SimLog) -> int:
    # The server owns asyncio objects, so it is built inside the running loop.
    return await SimulatedServer(ns, node, options, log).run()


if __name__ == "__main__":
    raise SystemExit(main())
