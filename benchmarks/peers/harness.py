"""SGLang's own tuner, auto_benchmark, run as SGLang ships it against autotune's simulated node.

Its code is not copied here: `auto_benchmark_source` takes `sglang/auto_benchmark_lib.py` from SGLang's
0.5.16 wheel on PyPI (the last release that has it; SGLang removed it on 2026-07-21), checks its SHA-256,
and keeps it under benchmarks/peers/.sglang/ (ignored by git). `load_auto_benchmark` imports it with the
stand-ins of shim/sglang/ for the SGLang modules it imports (datasets of token ids, no tokenizer).

auto_benchmark launches each server itself (`launch_server`: `subprocess.Popen` of `python -m
sglang.launch_server`, or its `server.command_prefix`) and measures it with SGLang's `bench_serving` as a
subprocess (`subprocess.run`). `ModelSubprocess` stands in for the `subprocess` module inside it: the launch
and the benchmark it asks for are answered by the simulated node's model (`NodeClock`, the model node of
benchmarks/model_studies.py, with the same noise and time accounting autotune's studies get there), and its
clock (`time` inside it: the 12-hour search limit) advances by the model's seconds. Everything else,
the candidates, the QPS search, the choice of the best, is auto_benchmark's own code.

The configs are the cookbook entries SGLang ships for auto_benchmark (`COOKBOOK`: the values of each YAML,
with the commit and path it was read from), with the profile's node layout, model, workload and draft.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import yaml

PEERS = Path(__file__).resolve().parent
sys.path.insert(0, str(PEERS.parent))

SHIM = PEERS / "shim"
sys.path.insert(0, str(SHIM))

from model_studies import NodeClock, Profile  # noqa: E402
from sglang.benchmark.serving import bench_serving_record  # noqa: E402

from autotune.measure.workloads import Workload  # noqa: E402
from autotune.trial.launch import Flags, ServerLaunch  # noqa: E402
from autotune.trial.startup import multithread_loading_flag  # noqa: E402
from autotune.trial.wire import TrialRequest  # noqa: E402

SGLANG_RELEASE = "0.5.16"
LIB_IN_WHEEL = "sglang/auto_benchmark_lib.py"
LIB_SHA256 = "b5a35dcdcd6b57f74e762197467fc6ab69d2a76f7c27fb1b1d9f1f6bf078d882"
# The commit issue 33 names; its auto_benchmark_lib.py is 18 characters shorter than the wheel's: 4 in the
# benchmark client's module name (BENCH_SERVING), 14 before the QPS search, in code this harness did not
# find changed (candidates, the QPS search, run_trial and the best record read the same).
SGLANG_COMMIT = "e5c00dc83b965029829a285eb9bb1ccac186954c"
CACHE = PEERS / ".sglang" / SGLANG_RELEASE
LAUNCH_SERVER = "sglang.launch_server"
# SGLang's benchmark client as auto_benchmark runs it: `-m sglang.benchmark.serving` in the 0.5.16 wheel,
# `-m sglang.bench_serving` at the commit (the 4 of the 18 characters that differ).
BENCH_SERVING = ("sglang.benchmark.serving", "sglang.bench_serving")


def auto_benchmark_source(cache: Path = CACHE) -> Path:
    """`sglang/auto_benchmark_lib.py` of the pinned SGLang wheel, downloaded once (pip, no dependencies)."""
    target = cache / "auto_benchmark_lib.py"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="sglang-wheel-") as folder:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    f"sglang=={SGLANG_RELEASE}",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "-q",
                    "-d",
                    folder,
                ],
                check=True,
            )
            wheel = next(Path(folder).glob("sglang-*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                target.write_bytes(archive.read(LIB_IN_WHEEL))
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != LIB_SHA256:
        raise RuntimeError(
            f"{target}: SHA-256 {digest}, expected {LIB_SHA256} "
            f"({LIB_IN_WHEEL} of sglang=={SGLANG_RELEASE}). "
            f"Delete {cache} and run again to download it anew."
        )
    return target


@functools.cache
def load_auto_benchmark() -> ModuleType:
    """SGLang's auto_benchmark_lib as a module, its SGLang imports answered by shim/sglang/."""
    name = "sglang.auto_benchmark_lib"
    spec = importlib.util.spec_from_file_location(name, auto_benchmark_source())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- the cookbook -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CookbookEntry:
    """One auto_benchmark config SGLang ships, as its YAML says: the baseline flags and the search spaces
    (in its order, which decides what tier 2 and 3 try first), and where it was read."""

    path: str
    commit: str
    base_flags: Mapping[str, Any]
    search_space: Mapping[str, Sequence[Any]]
    speculative_space: Mapping[str, Sequence[Any]]
    qps: tuple[float, float]  # its QPS search's lower and upper bound (tolerance 0.1, 5 rounds)
    max_candidates: int = 8


_COOKBOOK_DIR = ".claude/skills/sglang-auto-benchmark/references"


def _space(running: list[int]) -> dict[str, list[Any]]:
    """The search space every entry here has, in its order; only the running-request caps differ."""
    backends = ["fa3", "flashinfer"]
    return {
        "prefill_attention_backend": backends,
        "decode_attention_backend": backends,
        "chunked_prefill_size": [4096, 8192],
        "max_running_requests": running,
    }


def _speculative(topk: list[int]) -> dict[str, list[int]]:
    """The speculative stage's search space of every entry here; only the topk choices differ."""
    return {
        "speculative_num_steps": [3, 5],
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": [4, 8],
    }


_BASELINE = {"mem_fraction_static": 0.82, "schedule_policy": "lpm"}  # the first three entries'
COOKBOOK: Mapping[str, CookbookEntry] = {
    "kimi-k2.5": CookbookEntry(
        f"{_COOKBOOK_DIR}/cookbook-llm/kimi-k2.5.yaml",
        "bfdc72e826d8ff35702df75cae8b52b8761e1c5d",
        {"tp_size": 8, "trust_remote_code": True, **_BASELINE},
        _space([32, 48, 64]),
        _speculative([1, 2]),
        (0.25, 4.0),
    ),
    "llama-3.1-70b-instruct": CookbookEntry(
        f"{_COOKBOOK_DIR}/cookbook-llm/llama-3.1-70b-instruct.yaml",
        "62fa71c3e6338df8c64415db53970d8bdd066047",
        {"tp_size": 4, **_BASELINE},
        _space([64, 96, 128]),
        _speculative([1, 2]),
        (0.25, 12.0),
    ),
    # Not a cookbook page: the skill's own example config, the one SGLang ships for a 32B dense model.
    "qwen3-32b": CookbookEntry(
        f"{_COOKBOOK_DIR}/qwen3-32b.yaml",
        "0b142c7ba5a07edc2d5d4ef309a4cdb767596b3c",
        {"tp_size": 1, "trust_remote_code": True, **_BASELINE},
        _space([64, 96, 128]),
        _speculative([1, 4]),
        (1.0, 12.0),
    ),
    # Its own space: the memory fraction and expert parallelism searched, not pinned (the cookbook's B200
    # baseline; it gives no H100 or H200 default for this model).
    "qwen3-coder-480b-a35b-instruct": CookbookEntry(
        f"{_COOKBOOK_DIR}/cookbook-llm/qwen3-coder-480b-a35b-instruct.yaml",
        "3c9b183ebeefa49a2b771a092aa5a13189b8447e",
        {"tp_size": 8, "ep_size": 2, "moe_runner_backend": "triton"},
        {
            "mem_fraction_static": [0.82, 0.85, 0.88],
            "prefill_attention_backend": ["flashinfer"],
            "decode_attention_backend": ["flashinfer"],
            "chunked_prefill_size": [4096, 8192],
            "max_running_requests": [32, 48, 64],
            "schedule_policy": ["lpm", "fcfs"],
            "ep_size": [1, 2],
        },
        _speculative([1, 2]),
        (0.25, 4.0),
        max_candidates=24,
    ),
}
# The cookbook's SLA, every entry's: a QPS passes when the mean TTFT and the mean TPOT are under these.
SLA = {"max_ttft_ms": 1500, "max_tpot_ms": 30}
# The cookbook entry of each benchmark profile's model (Qwen2.5-32B has none: the 32B example stands in).
PROFILE_COOKBOOK = {
    "seed": "kimi-k2.5",
    "seed-1tb-host": "kimi-k2.5",  # the seed's node with its weights in the page cache
    "h200": "llama-3.1-70b-instruct",
    "h100x4-llama70b": "llama-3.1-70b-instruct",
    "heldout-l40sx4-qwen32b": "qwen3-32b",
    "h100x8-qwen3coder480b": "qwen3-coder-480b-a35b-instruct",
}


@dataclass(frozen=True)
class Variant:
    """How auto_benchmark is run: its search tier, and whether its speculative stage runs (it needs the
    draft's path, which the cookbook leaves empty)."""

    key: str
    tier: int
    speculative: bool = False


VARIANTS = (
    Variant("ab-tier2", 2),
    Variant("ab-tier3", 3),
    Variant("ab-tier2+spec", 2, speculative=True),
)


def auto_benchmark_config(
    profile: Profile,
    workload: Workload,
    variant: Variant,
    output_dir: Path,
    command_prefix: Sequence[str] | None = None,
    port: int = 30000,
    max_load: bool = False,
) -> dict[str, Any]:
    """auto_benchmark's config for `profile`: its cookbook entry's flags and search space, with the
    profile's node layout (--tp-size over the same GPUs autotune uses), model and draft paths, and its
    workload: fixed-length random prompts at a fixed concurrency, all sent at once (qps inf), so that the
    best is the highest output tok/s, as autotune's objective. No SLA: the objective has none. With
    `max_load`, its QPS search instead: the cookbook's bounds and SLA, no cap on requests in flight."""
    entry = COOKBOOK[PROFILE_COOKBOOK[profile.key]]
    base_flags = {**entry.base_flags, "tp_size": profile.tp, "model_path": profile.model_path}
    if profile.dp_size > 1:
        base_flags["dp_size"] = profile.dp_size
    server: dict[str, Any] = {
        "launch": True,
        "host": "127.0.0.1",
        "port": port,
        "base_flags": base_flags,
        "search_space": {key: list(values) for key, values in entry.search_space.items()},
    }
    if command_prefix is not None:
        server["command_prefix"] = list(command_prefix)
    benchmark: dict[str, Any] = {
        "backend": "auto",
        "tokenizer": profile.model_path,
        "max_concurrency": [workload.concurrency],
        "qps": float("inf"),
        "output_dir": str(output_dir),
        "warmup_requests": workload.warmup_requests,
    }
    if max_load:  # its QPS search under the cookbook's SLA, requests unbounded in flight (its `null`)
        lower, upper = entry.qps
        benchmark.update(
            max_concurrency=[None], qps={"lower": lower, "upper": upper, "tolerance": 0.1}, sla=dict(SLA)
        )
    return {
        "server": server,
        "dataset": {
            "kind": "random",
            "num_prompts": workload.num_prompts,
            "scenario_names": [profile.key],
            "input_len": [workload.input_len],
            "output_len": [workload.output_len],
            "random_range_ratio": 1.0,
        },
        "benchmark": benchmark,
        "search": {"tier": variant.tier, "max_candidates": entry.max_candidates, "resume": False},
        "speculative": {
            "enabled": variant.speculative,
            "algorithm": "EAGLE3",  # the profiles' drafts are EAGLE-3 drafts, which SGLang runs as EAGLE3
            "draft_model_path": profile.draft_model_path if variant.speculative else "",
            "search_space": {key: list(values) for key, values in entry.speculative_space.items()},
        },
    }


# -- the model node behind auto_benchmark's subprocesses ------------------------------------------------


@dataclass
class Launch:
    """One server auto_benchmark launched, as the node saw it: the argv after the program, the environment
    it added, the node seconds it took (start-up and benchmark), and whether it failed."""

    argv: tuple[str, ...]
    env: dict[str, str]
    seconds: float = 0.0
    failed: bool = False
    failure: str = ""


class SimTime:
    """The `time` module as auto_benchmark sees it: the clock is the node's, advanced by model seconds."""

    def __init__(self, start: float = 1.8e9) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def strftime(self, fmt: str, t: Any = None) -> str:
        import time

        return time.strftime(fmt, time.gmtime(self.now) if t is None else t)

    def localtime(self, seconds: float | None = None) -> Any:
        import time

        return time.gmtime(self.now if seconds is None else seconds)


@dataclass
class ModelServer:
    """What `Popen` returns for a launch: the launch and the log file auto_benchmark gave it."""

    launch: Launch
    stdout: IO[str] | None
    pid: int = -1
    returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class ModelSubprocess:
    """Stands in for the `subprocess` module inside auto_benchmark: a server launch (`Popen` of the server
    command) and a `bench_serving` run (`run`) answered by the model node `clock` on `workload`'s kind of
    requests, their node seconds added to `time` and recorded per launch in `launches`."""

    clock: NodeClock
    workload: Workload
    time: SimTime = field(default_factory=SimTime)
    launches: list[Launch] = field(default_factory=list)
    PIPE = subprocess.PIPE
    STDOUT = subprocess.STDOUT
    TimeoutExpired = subprocess.TimeoutExpired
    CompletedProcess = subprocess.CompletedProcess
    _server: ModelServer | None = None

    def Popen(  # the name auto_benchmark calls
        self,
        command: Sequence[str],
        stdout: IO[str] | None = None,
        stderr: Any = None,
        env: Mapping[str, str] | None = None,
        start_new_session: bool = False,
    ) -> ModelServer:
        flags = server_flags([str(part) for part in command])
        added = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
        self._server = ModelServer(Launch(tuple(flags), added), stdout)
        self.launches.append(self._server.launch)
        return self._server

    def run(
        self, command: Sequence[str], capture_output: bool = False, text: bool = False, timeout: Any = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(part) for part in command]
        if not set(BENCH_SERVING) & set(argv):
            raise RuntimeError(f"the model node runs only {BENCH_SERVING[0]}, not {shlex.join(argv)}")
        if self._server is None:
            return subprocess.CompletedProcess(argv, 1, "", "no server was launched")
        server, self._server = self._server, None
        result = self.clock.run(self.request(server.launch, bench_workload(argv, self.workload)))
        server.launch.seconds = (result.startup_s or 0.0) + (result.benchmark_s or 0.0)
        self.time.now += server.launch.seconds
        if result.benchmark is None:
            server.launch.failed = True
            server.launch.failure = result.failure.kind.value if result.failure else "failed"
            if server.stdout is not None:  # auto_benchmark reads the log's tail for its OOM hint
                server.stdout.write(result.log)
                server.stdout.flush()
            return subprocess.CompletedProcess(argv, 1, "", f"server failed: {server.launch.failure}")
        output = argv[argv.index("--output-file") + 1]
        with open(output, "a", encoding="utf-8") as f:
            f.write(json.dumps(bench_serving_record(result.benchmark)) + "\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    def request(self, launch: Launch, workload: Workload) -> TrialRequest:
        flags = typed_flags(launch.argv)
        # auto_benchmark given autotune's loading settings (issue 37's row), which the model node fits to its
        # host memory as it fits autotune's; not presharded weights, whose dumps cost its few launches over
        # several layouts more than they save (seed: 1.04 node h with them against 0.84 without)
        flags = (*flags, *multithread_loading_flag(dict(flags), None, None).items())
        server = ServerLaunch(
            ("python", "-m", LAUNCH_SERVER), dict(launch.env), "127.0.0.1", 30000, flags=flags
        )
        return TrialRequest(len(self.launches) - 1, server, workload, 3600.0, 3600.0)


def server_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """The server flags of a launch command (after `-m MODULE`, or all of them), --model-path first, where
    the model node (and autotune's launches) put it."""
    argv = list(argv)
    if "-m" in argv:
        argv = argv[argv.index("-m") + 2 :]
    if "--model-path" in argv:
        at = argv.index("--model-path")
        argv = [*argv[at : at + 2], *argv[:at], *argv[at + 2 :]]
    return tuple(argv)


def typed_flags(argv: Sequence[str]) -> Flags:
    """A launch's server flags as (flag, value) pairs, a value None for a switch (a flag followed by
    another flag or nothing)."""
    words = server_flags(argv)
    pairs: list[tuple[str, str | None]] = []
    for at, word in enumerate(words):
        if not word.startswith("--"):
            continue
        following = words[at + 1] if at + 1 < len(words) else None
        pairs.append((word, None if following is None or following.startswith("--") else following))
    return tuple(pairs)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value after `flag` in `argv`, None when absent."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def bench_workload(argv: Sequence[str], workload: Workload) -> Workload:
    """The workload a bench_serving command line sends: its prompts file's lengths, --num-prompts,
    --request-rate (Poisson arrivals, as bench_serving's default burstiness 1), --max-concurrency and
    --warmup-requests."""
    rate = float(flag_value(argv, "--request-rate") or "inf")
    rows = [
        json.loads(line) for line in Path(str(flag_value(argv, "--dataset-path"))).read_text().splitlines()
    ]
    inputs = {int(row["prompt_len"]) for row in rows}
    outputs = {int(row["output_len"]) for row in rows}
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"the model node plays one prompt and output length, not {inputs} and {outputs}")
    num_prompts = int(flag_value(argv, "--num-prompts") or len(rows))
    concurrency = flag_value(argv, "--max-concurrency")
    return Workload(
        num_prompts=num_prompts,
        input_len=inputs.pop(),
        output_len=outputs.pop(),
        concurrency=int(concurrency) if concurrency else num_prompts,
        warmup_requests=int(flag_value(argv, "--warmup-requests") or 0),
        request_rate=None if rate == float("inf") else rate,
    )


@dataclass(frozen=True)
class AutoBenchmarkRun:
    """One auto_benchmark run: every launch in order, its records, and the best record's server flags as
    argv (None when no candidate ran)."""

    launches: list[Launch]
    best_argv: tuple[str, ...] | None
    records: list[dict[str, Any]]
    error: str = ""  # what auto_benchmark stopped with, if it stopped before its end


def run_auto_benchmark(config: Mapping[str, Any], node: ModelSubprocess, folder: Path) -> AutoBenchmarkRun:
    """Run SGLang's auto_benchmark on `config` with its processes answered by `node`; its console quiet."""
    ab = load_auto_benchmark()
    path = folder / "auto_benchmark.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    patches = {
        "subprocess": node,
        "time": node.time,
        "preclean_stale_server": lambda port: None,  # it hunts real processes on the port: there are none
        "stop_server": _close_log,  # it signals the process group: the model's server has none
        "log_line": lambda message: None,
        "tqdm": functools.partial(ab.tqdm, disable=True),
    }
    saved = {name: getattr(ab, name) for name in patches}
    for name, value in patches.items():
        setattr(ab, name, value)
    error = ""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            ab.run_auto_benchmark(str(path))
    except ValueError as exc:  # e.g. its speculative stage after no base candidate ran: it ends there
        error = str(exc)
    finally:
        for name, value in saved.items():
            setattr(ab, name, value)
    records = ab.read_jsonl(os.path.join(config["benchmark"]["output_dir"], "results.jsonl"))
    best = ab.best_record(records)
    best_argv = None if best is None else server_flags(ab.cli_args(best["server_flags"]))
    return AutoBenchmarkRun(node.launches, best_argv, records, error)


def _close_log(process: ModelServer | None) -> None:
    log = getattr(process, "_autobench_log_file", None)
    if log is not None:
        log.close()


def run_auto_benchmark_e2e(config: Mapping[str, Any], folder: Path) -> list[dict[str, Any]]:
    """Run SGLang's auto_benchmark on `config` for real: it launches the servers of its
    `server.command_prefix` (the simulated server) as processes and runs the benchmark client
    (shim/sglang/benchmark/serving.py, autotune's client) as a subprocess; returns its records. Only its
    console is quiet and its pre-clean off: that kills whatever listens on the port, by pattern."""
    ab = load_auto_benchmark()
    path = folder / "auto_benchmark.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    patches = {
        "preclean_stale_server": lambda port: None,
        "log_line": lambda message: None,
        "tqdm": functools.partial(ab.tqdm, disable=True),
    }
    saved = {name: getattr(ab, name) for name in patches}
    pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SHIM), str(PEERS.parents[1]), *filter(None, [pythonpath])]
    )
    for name, value in patches.items():
        setattr(ab, name, value)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            ab.run_auto_benchmark(str(path))
    finally:
        for name, value in saved.items():
            setattr(ab, name, value)
        if pythonpath is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = pythonpath
    records: list[dict[str, Any]] = ab.read_jsonl(
        os.path.join(config["benchmark"]["output_dir"], "results.jsonl")
    )
    return records
