"""Failures as outcomes: how fast a fatal log line ends a trial, how much node time a study spends on configs
that fail (with and without the pre-flight memory check and the memory of incompatibilities), and whether
the pre-flight check ever rejects a config that would have started.

1. Fatal line to told. Real studies launch simulated SGLang servers as real processes (start-up clock sped
   up so a ten-minute weight load takes 0.6 s) that fail the way the seed's did (the seed: the session the
   simulator is calibrated on, see docs/concepts.md): "Not enough memory" at
   start, a CUDA error under load, each with the server exiting and with the server lingering after the
   line (`SGLANG_SIM_FAULT=linger`, the seed's case). A thread here polls the server logs every 10 ms and
   notes when a fatal line (autotune.trial.failures.is_fatal_line) first appears; `Study.tell` is timed as it
   returns. The difference includes stopping the server's process group and waiting for its port, which
   the node does before the driver tells. Through the local pool (a TrialExecutor in
   this process) and the Ray pool (the node actor), as `autotune run` does.
2. Node time on failed configs. 50-trial studies on the seed profile's model node (the simulated node's
   model answers each trial at once, with the node time it would take), the default sampler, over seeds,
   with both mechanisms, each alone, and neither, and with both but without the sampler's feasibility
   term (autotune.study.samplers.FeasibleTPESampler). Node time is start-up until ready or dead, plus the
   benchmark; a proposal refused without a launch costs none.
3. False rejections. Random configs of the shipped search space on every simulated hardware x model pair,
   over TP sizes and a wide range of --mem-fraction-static: each the pre-flight check rejects is launched
   on the model node anyway, and counted as a false rejection if it starts. The ground truth is the
   simulated node's memory model (SGLang's profile_max_num_token arithmetic), not a real GPU.

    python benchmarks/failures.py           # 5 trials per case on both pools, 20 seeds, 40000 configs
    python benchmarks/failures.py --quick   # a smoke run: 2 trials per case, local pool, 1 seed, 400 configs
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
import yaml
from model_studies import BENCHMARKS, PROFILES, Landscape, run_study, write_sim_study

from autotune.config import Study
from autotune.measure.client import Workload
from autotune.node.executor import TrialExecutor
from autotune.node.pool import LocalNodePool, NodePool, RayNodePool
from autotune.node.runner import LocalCommandRunner, free_port
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study import samplers
from autotune.study.loop import StudyDriver
from autotune.study.preflight import predicted_oom
from autotune.study.records import FAILURE_KIND_ATTR
from autotune.trial.failures import is_fatal_line
from autotune.trial.launch import Flags
from autotune.trial.redaction import Secrets
from autotune.trial.wire import TrialRequest

warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
TOLD_TARGET_S, SHARE_TARGET = 2.0, 0.10
POLL_S = 0.01
OBJECTIVE = BENCHMARKS / "objectives" / "overhead.yaml"
SIM_ENV = {"SGLANG_SIM_STARTUP_TIME_SCALE": "0.001", "SGLANG_SIM_TIME_SCALE": "0.01"}


# -- 1. fatal line to told ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A way the seed's servers failed: extra server flags and simulator faults."""

    label: str
    flags: dict[str, Any]
    fault: str


CASES = (
    Case("start-up: Not enough memory, server exits", {"--mem-fraction-static": 0.55}, ""),
    Case("start-up: Not enough memory, server lingers", {"--mem-fraction-static": 0.55}, "linger"),
    Case("under load: CUDA error, server exits", {}, "crash_benchmark:200"),
    Case("under load: CUDA error, server lingers", {}, "crash_benchmark:200,linger"),
)


def write_case_study(folder: Path, case: Case, n_trials: int) -> Study:
    """A study whose every trial launches the failing config (the search space only sets an unused knob)."""
    space = folder / "space.yaml"
    # NCCL_ALGO unset or Ring: the seed node's custom all-reduce leaves NCCL nothing to change here.
    space.write_text(
        yaml.safe_dump(
            {"parameters": {"NCCL_ALGO": {"kind": "nccl", "type": "categorical", "choices": [None, "Ring"]}}}
        )
    )
    env = {**SIM_ENV, **({"SGLANG_SIM_FAULT": case.fault} if case.fault else {})}
    return write_sim_study(
        folder,
        "failures",
        search_space=space,
        objective=OBJECTIVE,
        n_trials=n_trials,
        server={
            "draft_model_path": None,
            "port": free_port(),
            "flags": {"--tp-size": 8, **case.flags},
            "env": env,
        },
        sampler={"name": "random", "seed": 0},
        timeouts={"startup_s": 60, "benchmark_s": 60},
    )


class FatalLineWatch(threading.Thread):
    """Polls every server log under a folder and notes when each first shows a fatal line."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.seen: dict[int, float] = {}  # trial number -> perf_counter when its fatal line was first read
        self._offsets: dict[Path, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for log in self.folder.rglob("trial-*/server.log"):
                number = int(log.parent.name.removeprefix("trial-"))
                if number in self.seen:
                    continue
                with log.open("rb") as handle:
                    handle.seek(self._offsets.get(log, 0))
                    chunk = handle.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
                self._offsets[log] = self._offsets.get(log, 0) + len(complete)
                text = complete.decode("utf-8", errors="replace")
                if any(is_fatal_line(line) for line in text.splitlines()):
                    self.seen[number] = time.perf_counter()
            self._halt.wait(POLL_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()


@dataclass(frozen=True)
class Latency:
    case: Case
    pool: str
    seconds: list[float]  # fatal line read to trial told, per trial
    kinds: list[str]


@contextmanager
def tell_times() -> Iterator[dict[int, float]]:
    """When each trial's `Study.tell` returned (perf_counter), by trial number."""
    told: dict[int, float] = {}
    original = optuna.study.Study.tell

    def tell(study: optuna.Study, trial: Any, *args: Any, **kwargs: Any) -> Any:
        frozen = original(study, trial, *args, **kwargs)
        told[frozen.number] = time.perf_counter()
        return frozen

    optuna.study.Study.tell = tell  # type: ignore[method-assign,assignment]
    try:
        yield told
    finally:
        optuna.study.Study.tell = original  # type: ignore[method-assign]


def measure_latency(case: Case, pool_kind: str, n_trials: int) -> Latency:
    with tempfile.TemporaryDirectory(prefix="autotune-failures-") as folder, tell_times() as told:
        study = write_case_study(Path(folder), case, n_trials)

        def pool(study: Study) -> NodePool:
            if pool_kind == "ray":
                return RayNodePool(study)
            workdir = study.workdir / "nodes" / "local"
            return LocalNodePool({"local": TrialExecutor("local", LocalCommandRunner(workdir), workdir)})

        watch = FatalLineWatch(Path(folder))
        watch.start()
        try:
            optuna_study = StudyDriver(study, pool=pool, preflight=False).run()
        finally:
            watch.stop()
            if pool_kind == "ray":
                import ray

                ray.shutdown()
        kinds = {t.number: t.user_attrs.get(FAILURE_KIND_ATTR, t.state.name) for t in optuna_study.trials}
    missing = sorted(set(told) - set(watch.seen))
    if missing:
        raise RuntimeError(f"{case.label}: trials {missing} were told with no fatal line in their logs")
    numbers = sorted(told)
    return Latency(case, pool_kind, [told[n] - watch.seen[n] for n in numbers], [kinds[n] for n in numbers])


def print_latencies(results: list[Latency]) -> None:
    print("1. Fatal line to trial told (seconds; the line read by a 10 ms poll of the log)")
    width = max(len(r.case.label) for r in results) + 8
    print(f"{'case':<{width}}{'pool':>6}{'trials':>8}{'median':>9}{'max':>8}   kinds")
    for r in results:
        print(
            f"{r.case.label:<{width}}{r.pool:>6}{len(r.seconds):>8}{statistics.median(r.seconds):>9.2f}"
            f"{max(r.seconds):>8.2f}   {', '.join(sorted(set(r.kinds)))}"
        )
    worst = max(max(r.seconds) for r in results)
    verdict = "under" if worst < TOLD_TARGET_S else "OVER"
    print(f"longest: {worst:.2f} s, {verdict} the target of {TOLD_TARGET_S:.0f} s")


# -- 2. node time on failed configs ---------------------------------------------------------------------
# (pre-flight check, incompatibility memory, the sampler's feasibility weight): autotune's default first.
# (pre-flight check, its memory edge, incompatibility memory, the sampler's feasibility weight)
VARIANTS = {
    "pre-flight check and incompatibility memory (autotune)": (True, True, True, 1.0),
    "both, pre-flight without the memory edge a study met": (True, False, True, 1.0),
    "both, sampler without its feasibility term": (True, True, True, 0.0),
    "incompatibility memory only": (False, False, True, 1.0),
    "pre-flight check only": (True, True, False, 1.0),
    "neither": (False, False, False, 1.0),
}


@dataclass(frozen=True)
class Share:
    variant: str
    seed: int
    failed_s: float
    node_s: float
    failed_launches: int


def study_share(variant: str, seed: int, n_trials: int) -> Share:
    preflight, memory_edge, remember, feasibility = VARIANTS[variant]
    run = run_study(
        PROFILES["seed"],
        n_trials,
        seed=seed,
        sampler=lambda _study: samplers.tpe(seed, feasibility_weight=feasibility),
        preflight=preflight,
        memory_edge=memory_edge,
        remember_incompatible=remember,
    )
    failed = [s for s, v in zip(run.node_s, run.values, strict=True) if v is None]
    return Share(variant, seed, sum(failed), sum(run.node_s), sum(1 for s in failed if s > 0))


def print_shares(shares: list[Share], n_trials: int) -> None:
    seeds = len({s.seed for s in shares})
    print(
        f"\n2. Node time spent on configs that failed, {n_trials}-trial studies on the seed profile, "
        f"default sampler, {seeds} seeds: median [min-max]"
    )
    width = max(len(v) for v in VARIANTS) + 2
    print(f"{'':<{width}}{'share failed':>22}{'node hours':>14}{'failed launches':>18}")
    for variant in VARIANTS:
        mine = [s for s in shares if s.variant == variant]
        ratio = [s.failed_s / s.node_s for s in mine]
        print(
            f"{variant:<{width}}{f'{statistics.median(ratio):.1%} [{min(ratio):.0%}-{max(ratio):.0%}]':>22}"
            f"{statistics.median(s.node_s for s in mine) / 3600:>14.1f}"
            f"{statistics.median(s.failed_launches for s in mine):>18.1f}"
        )
    ours = statistics.median(s.failed_s / s.node_s for s in shares if s.variant == next(iter(VARIANTS)))
    verdict = "under" if ours < SHARE_TARGET else "OVER"
    print(f"with both: {ours:.1%} of node time on failed configs, {verdict} the target of {SHARE_TARGET:.0%}")


# -- 3. false rejections --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rejections:
    hardware: str
    model: str
    sampled: int
    rejected: int
    false_rejections: int
    start_ooms: int  # launches that did not start for lack of memory
    start_ooms_let_through: int


def sample_rejections(hardware_name: str, model_name: str, samples: int, seed: int) -> Rejections:
    """Random configs on one hardware x model pair, each checked by the pre-flight and run on the model."""
    hardware, model = load_hardware_profile(hardware_name), load_model_profile(model_name)
    facts = node_report("node", hardware, model)
    executor = ModelNodeExecutor("node", hardware, model)
    rng = random.Random(seed)
    workload = Workload(num_prompts=4, input_len=1024, output_len=64, concurrency=4)
    profile = PROFILES["seed"]
    rejected = false = ooms = let_through = 0
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        landscape = Landscape(profile, Path(folder))
        for _ in range(samples):
            params = landscape.random_params(rng, keep_default=0.5)
            config = landscape.space.suggest(optuna.trial.FixedTrial(params))
            launch = landscape.study.server_launch(config)
            flags = _with_flags(
                launch.flags,
                {
                    "--tp-size": str(rng.choice([2, 4, 8])),
                    "--mem-fraction-static": f"{rng.uniform(rng.choice([0.3, 0.65]), 0.95):.3f}",
                },
            )
            rejects = predicted_oom(flags, facts.gpu_memory_gb, model.weight_gb) is not None
            server = replace(launch, flags=flags, host="127.0.0.1", port=30000, secrets=Secrets())
            request = TrialRequest(0, server, workload, 1.0, 1.0)
            result = executor.run(request)
            started = result.failure is None or result.benchmark_s is not None
            start_oom = not started and result.failure is not None and result.failure.kind.is_oom
            rejected += rejects
            false += rejects and started
            ooms += start_oom
            let_through += start_oom and not rejects
    return Rejections(hardware_name, model_name, samples, rejected, false, ooms, let_through)


def _with_flags(flags: Flags, values: dict[str, str]) -> Flags:
    """`flags` with each of `values` set (the first such flag replaced where present, appended where not)."""
    out = list(flags)
    for name, value in values.items():
        at = next((i for i, (flag, _) in enumerate(out) if flag == name), None)
        if at is None:
            out.append((name, value))
        else:
            out[at] = (name, value)
    return tuple(out)


def print_rejections(found: list[Rejections]) -> None:
    total = sum(r.sampled for r in found)
    print(
        f"\n3. Pre-flight false rejections: {total} random configs of the shipped search space, TP 2/4/8, "
        "--mem-fraction-static 0.30-0.95 (half 0.65-0.95), each launched on the simulated node's model"
    )
    header = f"{'sampled':>9}{'rejected':>10}{'false rejections':>18}{'start OOMs let through':>25}"
    print(f"{'hardware x model':<44}{header}")
    for r in found:
        print(
            f"{r.hardware + ' x ' + r.model:<44}{r.sampled:>9}{r.rejected:>10}{r.false_rejections:>18}"
            f"{f'{r.start_ooms_let_through} of {r.start_ooms}':>25}"
        )
    false = sum(r.false_rejections for r in found)
    caught = sum(r.start_ooms - r.start_ooms_let_through for r in found)
    print(
        f"false rejections: {false} of {sum(r.rejected for r in found)} rejected "
        f"({'meets' if false == 0 else 'MISSES'} the target of 0); the check caught {caught} of "
        f"{sum(r.start_ooms for r in found)} start-up OOMs without a launch"
    )


# -- main -----------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per failure case and pool")
    parser.add_argument("--pools", default="local,ray", help="comma-separated: local, ray")
    parser.add_argument("--seeds", type=int, default=20, help="seeds of the studies of part 2")
    parser.add_argument("--study-trials", type=int, default=50, help="trials of each study of part 2")
    parser.add_argument("--configs", type=int, default=40000, help="configs sampled for false rejections")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="studies run in parallel")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 trials, local pool, 1 seed")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.pools, args.seeds, args.configs = 2, "local", 1, 400
    pools = [p for p in args.pools.split(",") if p]
    if not pools or not set(pools) <= {"local", "ray"}:
        parser.error(f"--pools takes local and/or ray, but got {args.pools!r}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = time.monotonic()

    print_latencies([measure_latency(case, pool, args.trials) for pool in pools for case in CASES])

    pairs = [
        (hardware, model)
        for hardware in ("rtx-pro-6000-pcie-x8", "h200-nvlink-x8")
        for model in ("kimi-k2.5-int4", "llama-70b-bf16")
    ]
    context = multiprocessing.get_context("fork")
    with context.Pool(args.jobs) as pool:
        shares = pool.starmap(
            study_share, [(v, s, args.study_trials) for v in VARIANTS for s in range(args.seeds)]
        )
        per_pair = max(1, args.configs // len(pairs))
        found = pool.starmap(sample_rejections, [(h, m, per_pair, i) for i, (h, m) in enumerate(pairs)])
    print_shares(shares, args.study_trials)
    print_rejections(found)
    print(f"\n{time.monotonic() - started:.0f} s on {os.cpu_count()} CPU cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
