"""A simulated launch's start-up, phase by phase as SGLang logs it: distributed init, weight loading, the
KV pool, decode and prefill CUDA-graph capture, and the warm-up request; each phase lasts its modelled
time and a start-up failure dies in its own phase with SGLang's lines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from aiohttp import ClientError, ClientSession, ClientTimeout

from autotune.sim.logfmt import tqdm_line
from autotune.sim.model.failures import presharded_plan_lines
from autotune.sim.model.startup import dump_part, presharded_dump
from autotune.sim.server.launch import LaunchPart
from autotune.sim.server_args import server_args_repr
from autotune.sim.weight_cache_daemon import exported_tensors

HANG_LOAD_FRACTION = 0.19  # where the seed's log stopped: shard 12 of 64
WARMUP_WAIT_S = 1.0  # SGLang's _wait_and_warmup sleeps a second before its first /get_model_info
WARMUP_PROMPT = "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8


def write_dump(folder: Path, ranks: int) -> None:
    """What SGLang's first presharded launch leaves (loader.py: _dump_state_to_disk): the plan, then READY
    once every rank's files are written; the simulated weights are the plan alone."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"version": 1, "world_size": ranks, "files": [], "rank_to_reads": {}}
    (folder / "checksum.json").write_text(json.dumps(plan))
    (folder / "READY").write_text(json.dumps({"plan_version": 1, "world_size": ranks}))


def compile_cache_marker() -> Path | None:
    """What the simulated server leaves in SGLang's cache folder once it has compiled: the next launch with
    the same folder captures its graphs warm. Only a folder the launch names (SGLANG_CACHE_DIR, as the
    node sets it): real SGLang's default ~/.cache/sglang would tie every simulated launch on a machine."""
    folder = os.environ.get("SGLANG_CACHE_DIR")
    return Path(folder) / "autotune-sim-compiled" if folder else None


class Startup(LaunchPart):
    """The start-up phases of one launch, logged on every scheduler rank."""

    async def _sleep_model(self, seconds: float) -> None:
        """Sleep through a start-up phase of `seconds` model time."""
        if seconds > 0:
            await asyncio.sleep(seconds * self.options.startup_time_scale)

    async def run(self) -> None:
        """Every phase up to the scheduler's summary line; a start-up failure dies in its phase."""
        for note in self.node.notes:
            self.log.info(note)
        self.log.info(f"server_args={server_args_repr(self.args, self.options.version)}")
        failure = self.node.startup_failure
        phase = failure.phase if failure else None
        marker = compile_cache_marker()
        self.node.compile_cache_warm = marker is not None and marker.is_file()  # an earlier launch compiled
        dump = presharded_dump(self.node)
        self.node.weights_presharded = dump is not None and (Path(dump) / "READY").is_file()
        await self._init_distributed(fail=phase == "init")
        await self._load_weights(fail=phase == "load")
        if phase == "kv" and failure:
            self.ranks.die(failure.rank, failure.lines)
        self._allocate_kv_cache()
        if phase == "runner" and failure:
            self.ranks.die(failure.rank, failure.lines)
        await self._capture_prefill_graphs(fail=phase == "prefill_capture")  # first, as SGLang does
        await self._capture_cuda_graphs(fail=phase == "capture")
        if marker is not None:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        plan, chunked = self.plan, self.args["chunked_prefill_size"]
        self.ranks.all(
            f"max_total_num_tokens={plan.kv_tokens}, chunked_prefill_size={chunked}, "
            f"max_prefill_tokens={plan.max_prefill_tokens}, "
            f"max_running_requests={plan.max_running_requests}, "
            f"context_len={plan.context_len}, available_gpu_mem={plan.avail_after_graph_gb:.2f} GB"
        )

    def _fail_here(self) -> NoReturn:
        failure = self.node.startup_failure
        assert failure is not None  # only called for the failure's own phase
        if failure.logged:
            self.ranks.error(failure.rank, "\n".join(failure.logged))
        self.ranks.die(failure.rank, failure.lines)

    async def _init_distributed(self, fail: bool) -> None:
        plan = self.plan
        self.ranks.all("Init torch distributed begin.")
        for warning in self.node.warnings:
            self.ranks.all(warning, warning=True)
        if fail:
            await self._sleep_model(self.node.init_seconds / 2)
            self._fail_here()
        await self._sleep_model(self.node.init_seconds)
        init_usage = plan.init_used_gb - self.node.hw.cuda_context_gb
        elapsed = self.node.init_seconds
        self.ranks.all(f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={init_usage:.2f} GB")

    async def _load_weights(self, fail: bool) -> None:
        plan, model = self.plan, self.node.model
        self.ranks.all(f"Load weight begin. avail mem={plan.total_gb - plan.init_used_gb:.2f} GB")
        if fail:
            self._fail_here()
        if self.node.weights_mapped:
            await self._map_weights()
            return
        if self.ns.weight_cache_mode == "client":  # no daemon for this model and layout (ipc_loader.py:113)
            self.ranks.all(
                "[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load",
                warning=True,
            )
        dump = presharded_dump(self.node)
        if dump is not None and self.node.weights_presharded:
            await self._load_presharded(dump)
            return
        if dump is not None:  # loader.py: PreshardedModelLoader.load_model
            self.ranks.all(f"No presharded checkpoint at {dump}; doing first-time load and dump.")
        shards, dump_s = model.num_shards, dump_part(self.node)
        per_shard = (self.node.load_seconds - dump_s) / shards
        # buffered_multi_thread_safetensors_weights_iterator's bar, or the single-threaded loader's.
        threaded = self.node.settings.load_threads > 1
        desc = "Multi-thread loading shards" if threaded else "Loading safetensors checkpoint shards"
        self.log.raw(tqdm_line(desc, 0, shards, 0.0))
        hang_at = int(shards * HANG_LOAD_FRACTION) if "hang_load" in self.options.faults else None
        for done in range(1, shards + 1):
            if done == hang_at:
                await asyncio.Event().wait()  # no progress, no error: only a timeout catches this
            await self._sleep_model(per_shard)
            self.log.raw(tqdm_line(desc, done, shards, done * per_shard))
        if dump is not None:  # hashing and writing, after the shards' bar (no bar of its own)
            await self._sleep_model(dump_s)
            write_dump(Path(dump), self.node.settings.tp_size)
        self._load_weight_end(self.node.load_seconds)

    async def _load_presharded(self, dump: str) -> None:
        """Each rank reads its own share of an earlier launch's dump (loader.py: _load_from_presharded),
        whose plan must be of the version this SGLang writes."""
        self.ranks.all(f"Loading from presharded checkpoint at {dump}")
        version = json.loads((Path(dump) / "checksum.json").read_text()).get("version")
        if version != 1:
            self.ranks.die(0, presharded_plan_lines(dump, version))
        await self._sleep_model(self.node.load_seconds)
        self._load_weight_end(self.node.load_seconds)

    def _load_weight_end(self, seconds: float) -> None:
        plan, model = self.plan, self.node.model
        quant = f"quant={model.quantization}, " if model.quantization else ""  # model_runner.py:1097-1106
        self.ranks.all(
            f"Load weight end. elapsed={seconds:.2f} s, type={model.architecture}, {quant}"
            f"avail mem={plan.avail_after_weights_gb:.2f} GB, mem usage={plan.weights_gb:.2f} GB."
        )

    async def _map_weights(self) -> None:
        """A weight cache client: the daemon's tensors mapped over CUDA IPC (0.5.17 ipc_loader.py:120-157)."""
        model, seconds = self.node.model, self.node.load_seconds
        tensors = exported_tensors(model)
        self.ranks.all(f"[IpcModelLoader] Fetched {tensors} IPC handles from daemon in 0.00s")
        await self._sleep_model(seconds)
        self.ranks.all(f"[IpcModelLoader] Loaded model via IPC (mode=client), total={seconds:.2f}s")
        self._load_weight_end(seconds)

    def _allocate_kv_cache(self) -> None:
        plan = self.plan
        if self.node.model.kv_sharded_by_tp:
            sizes = f"K size: {plan.kv_gb / 2:.2f} GB, V size: {plan.kv_gb / 2:.2f} GB"
        else:
            sizes = f"KV size: {plan.kv_gb:.2f} GB"  # MLA keeps one latent cache, and SGLang says so
        dtype = (
            "torch.float8_e4m3fn" if self.node.settings.kv_cache_dtype.startswith("fp8") else "torch.bfloat16"
        )
        self.ranks.all(f"KV Cache is allocated. dtype: {dtype}, #tokens: {plan.kv_tokens}, {sizes}")
        self.ranks.all(f"Memory pool end. avail mem={plan.avail_after_kv_gb:.2f} GB")

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
        before = plan.avail_after_kv_gb - plan.prefill_graph_gb
        self.ranks.all(
            f"Capture {name} CUDA graph begin. backend={self.args['cuda_graph_config'].decode.backend}, "
            f"num_tokens_per_req={tokens}, {'' if at_end else f'bs={sizes}, '}"
            f"avail mem={before:.2f} GB"
        )
        if fail:
            await self._sleep_model(self.node.capture_seconds / max(len(sizes), 1))
            self._fail_here()
        await self._sleep_model(self.node.capture_seconds)
        self.ranks.all(
            f"Capture {name} CUDA graph end. {f'bs={sizes}, ' if at_end else ''}"
            f"elapsed={self.node.capture_seconds:.2f} s, mem usage={plan.graph_gb:.2f} GB, "
            f"avail mem={plan.avail_after_graph_gb:.2f} GB."
        )

    async def _capture_prefill_graphs(self, fail: bool) -> None:
        """The prefill graphs, captured before the decode graphs with memory of their own
        (cuda_graph_setup.py:127-133, 342-376), unless 0.5.17's gate dropped them for want of it."""
        plan = self.plan
        if plan.prefill_graph_dropped_at_gb is not None:
            free, needed = plan.prefill_graph_dropped_at_gb, self.node.version.prefill_graph_min_free_gb
            self.ranks.all(
                f"Disabling auto-selected prefill CUDA graph: only {free:.2f} GiB is free after "
                f"model/KV/eager-buffer allocation; at least {needed:.2f} GiB is required for capture. "
                "Set an explicit prefill CUDA graph backend to override this safety gate.",
                warning=True,
            )
        if not plan.prefill_graph_sizes:
            return
        before = plan.avail_after_kv_gb
        self.ranks.all(
            f"Capture target prefill CUDA graph begin. backend={self.node.prefill_graph_backend}, "
            f"num_tokens={plan.prefill_graph_sizes}, avail mem={before:.2f} GB"
        )
        seconds = self.node.prefill_capture_seconds
        if fail:
            await self._sleep_model(seconds / 2)
            self._fail_here()
        await self._sleep_model(seconds)
        self.ranks.all(
            f"Capture target prefill CUDA graph end. elapsed={seconds:.2f} s, "
            f"mem usage={plan.prefill_graph_gb:.2f} GB, avail mem={before - plan.prefill_graph_gb:.2f} GB."
        )

    async def warm_up(self, base_url: str) -> None:
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
                async with session.get(base_url + "/get_model_info") as response:
                    response.raise_for_status()
                if failure is not None and failure.phase == "warmup":
                    self.ranks.die(failure.rank, failure.lines)
                async with session.post(base_url + "/generate", json=body) as response:
                    response.raise_for_status()
                    await response.read()
        except (TimeoutError, ClientError) as exc:
            self.log.error(f"Initialization failed. warmup error: {exc!r}")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
