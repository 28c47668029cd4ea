"""The simulated server beside the real one: every trial of a real study, its real tok/s and the model's.

Reads a study's stores as the GPU machine brought them back (`study.tar.gz`), rebuilds each trial's launch
from the study file, and asks the simulated node's model (`autotune.sim.predict`) for the same launch on
the objective's workload. Two tables: the step costs SGLang logged in each trial's server.log (a prefill
batch's tokens per second; the mean decode step, in or out of a CUDA graph) beside the model's step for the
same batch and context; then the objective, real and simulated, with the Spearman rank correlation and the
median relative error over the trials that completed on the real server. With several --study, each
study's tables, then the agreement over all their completed trials.

    python benchmarks/sglang-h200/sim_vs_real.py benchmarks/sglang-h200/run3/study.tar.gz
    python benchmarks/sglang-h200/sim_vs_real.py benchmarks/sglang-h200/run3/study.tar.gz \
        --study examples/sglang-h200.yaml --study examples/sglang-h200-startup-oom.yaml
"""

from __future__ import annotations

import argparse
import re
import statistics
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial
from scipy.stats import spearmanr

from autotune.config import Study, load_study
from autotune.sim.model import NodePerformanceModel
from autotune.sim.predict import predict
from autotune.sim.profiles import (
    HardwareProfile,
    ModelProfile,
    StandardWorkload,
    load_hardware_profile,
    load_model_profile,
)
from autotune.study.rules import trial_config

REPO = Path(__file__).resolve().parents[2]
PREFILL = re.compile(r"Prefill batch, .*#new-token: (\d+), .*input throughput \(token/s\): ([\d.]+)")
DECODE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+), .*cuda graph: (True|False), "
    r"gen throughput \(token/s\): ([\d.]+)"
)
KV_POOL = re.compile(r"KV Cache is allocated\. .*#tokens: (\d+)")
AVAILABLE = re.compile(r"max_total_num_tokens=\d+, .*available_gpu_mem=([\d.]+) GB")
GIB_PER_GB = 1e9 / (1 << 30)  # SGLang's "GB" are GiB; the model's are 1e9 bytes
FULL_PREFILL_TOKENS = 4096  # prefill batches this large are whole chunks, not a wave's stragglers


@dataclass(frozen=True)
class DecodeInterval:
    """SGLang's decode log line: the mean step over the last `decode_log_interval` steps, all decode."""

    batch: int
    context_tokens: int  # KV tokens of the running batch at the interval's middle
    in_graph: bool
    step_s: float


@dataclass(frozen=True)
class StepCosts:
    """What one server.log says its steps cost."""

    prefill: list[tuple[int, float]]  # (tokens, seconds) of prefill batches that followed another
    decode: list[DecodeInterval]
    kv_tokens: int | None = None  # the KV pool SGLang allocated
    available_gib: float | None = None  # GPU memory left after the CUDA graphs


def step_costs(log: str, decode_log_interval: int = 40) -> StepCosts:
    """The step costs in a real server.log: an interval counts only when nothing but its own batch ran in
    it (no prefill between two decode lines, no request joining or leaving the decode batch)."""
    prefill: list[tuple[int, float]] = []
    decode: list[DecodeInterval] = []
    previous: tuple[int, int] | None = None  # the last line's (batch, KV tokens) when it was a decode line
    after_prefill = False
    kv_tokens = available = None
    for line in log.splitlines():
        if match := KV_POOL.search(line):
            kv_tokens = int(match[1])
        elif match := AVAILABLE.search(line):
            available = float(match[1])
        elif match := PREFILL.search(line):
            tokens, rate = int(match[1]), float(match[2])
            if after_prefill and tokens >= FULL_PREFILL_TOKENS:
                prefill.append((tokens, tokens / rate))
            previous, after_prefill = None, True
        elif match := DECODE.search(line):
            batch, tokens, graph, rate = int(match[1]), int(match[2]), match[3] == "True", float(match[4])
            if previous == (batch, tokens - batch * decode_log_interval):
                middle = tokens - batch * decode_log_interval // 2
                decode.append(DecodeInterval(batch, middle, graph, batch / rate))
            previous, after_prefill = (batch, tokens), False
    return StepCosts(prefill, decode, kv_tokens, available)


@dataclass(frozen=True)
class TrialRow:
    """One trial of the real study and the model's answers for its launch."""

    number: int
    state: str
    real: float | None
    sim: float
    sim_failure: str
    costs: StepCosts | None
    node: NodePerformanceModel

    def prefill_rates(self) -> tuple[float, float] | None:
        """(real, model) tokens per second of the trial's full prefill batches."""
        if self.costs is None or not self.costs.prefill:
            return None
        real = statistics.median(tokens / seconds for tokens, seconds in self.costs.prefill)
        tokens = statistics.median(t for t, _ in self.costs.prefill)
        return real, tokens / self.node.prefill_step_s(int(tokens), int(tokens))

    def decode_steps(self, in_graph: bool) -> tuple[float, float, int] | None:
        """(real, model) mean decode step in seconds, in or out of a CUDA graph, and its batch."""
        if self.costs is None:
            return None
        steps = [d for d in self.costs.decode if d.in_graph == in_graph]
        if not steps:
            return None
        real = statistics.mean(d.step_s for d in steps)
        model = statistics.mean(self.node.decode_step_s(d.batch, d.context_tokens) for d in steps)
        return real, model, round(statistics.median(d.batch for d in steps))


@contextmanager
def unpacked(stores: Path, study_name: str) -> Iterator[tuple[Path, list[FrozenTrial]]]:
    """One study's folder and its trials, from stores as the GPU machine brought them back (study.tar.gz);
    the folder is gone when the block ends."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(stores) as tar:
            tar.extractall(tmp, filter="data")
        folder = Path(tmp) / ".autotune" / study_name
        storage = f"sqlite:///{folder / 'optuna.db'}"
        yield folder, optuna.load_study(study_name=study_name, storage=storage).get_trials()


def compare(
    stores: Path, study: Study, hardware: HardwareProfile, model: ModelProfile, trials: set[int] | None = None
) -> list[TrialRow]:
    """Every trial in `stores` (or those numbered in `trials`), real beside simulated."""
    w = study.objective.workload
    if w is None:
        raise SystemExit(f"{study.name}: its objective has no workload to simulate")
    workload = StandardWorkload(
        num_prompts=w.num_prompts, input_len=w.input_len, output_len=w.output_len, concurrency=w.concurrency
    )
    skip = len(study.file.server.command)
    rows = []
    with unpacked(stores, study.name) as (folder, stored):
        for t in stored:
            if (trials is not None and t.number not in trials) or t.state == optuna.trial.TrialState.WAITING:
                continue  # not chosen, or never launched (a queued trial has no values yet)
            launch = study.server_launch(trial_config(study, t))
            p = predict(hardware, model, launch.argv[skip:], launch.env, workload)
            logs = list(folder.glob(f"nodes/*/trial-{t.number:04d}/server.log"))
            complete = t.state == optuna.trial.TrialState.COMPLETE
            oom = p.result is not None and bool(p.result.oom_lines)
            rows.append(
                TrialRow(
                    number=t.number,
                    state=t.state.name,
                    real=t.value if complete else None,
                    sim=p.output_throughput,
                    sim_failure=(p.failure_line or ("out of memory under load" if oom else ""))[:60],
                    costs=step_costs(logs[0].read_text(errors="replace")) if logs else None,
                    node=p.node,
                )
            )
    return rows


def agreement(rows: list[TrialRow]) -> tuple[int, float | None, float] | None:
    """(completed trials, Spearman rank correlation, median relative error) of the objective; the
    correlation is None when the model gives every trial one value (nothing to rank)."""
    pairs = [(r.real, r.sim) for r in rows if r.real]
    if len(pairs) < 3:
        return None
    real, sim = zip(*pairs, strict=True)
    rho = float(spearmanr(real, sim).statistic) if len(set(sim)) > 1 else None
    return len(pairs), rho, statistics.median(abs(s - r) / r for r, s in pairs)


def _summary(rows: list[TrialRow], what: str) -> str:
    if (found := agreement(rows)) is None:
        return f"{what}: fewer than 3 completed trials"
    n, rho, error = found
    ranks = f"Spearman {rho:.3f}" if rho is not None else "Spearman undefined (one model value for all)"
    return f"{n} completed trials{what}: {ranks}, median relative error {error:.1%}"


def _pair(values: tuple[float, float] | None, scale: float = 1.0) -> str:
    if values is None:
        return f"{'-':>7} {'-':>7}"
    return f"{values[0] * scale:7.1f} {values[1] * scale:7.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", type=Path, help="study.tar.gz: the study's .autotune/ folder, as brought back")
    ap.add_argument(
        "--study",
        type=Path,
        action="append",
        help="a study file whose stores are in the archive (repeatable; default examples/sglang-h200.yaml)",
    )
    ap.add_argument("--hardware", default="h200-x1")
    ap.add_argument("--model", default="llama-8b-dummy")
    ap.add_argument("--trials", help="comma-separated trial numbers to compare (default: all)")
    args = ap.parse_args()

    hardware, model = load_hardware_profile(args.hardware), load_model_profile(args.model)
    chosen = {int(n) for n in args.trials.split(",")} if args.trials else None
    every: list[TrialRow] = []
    for path in args.study or [REPO / "examples" / "sglang-h200.yaml"]:
        study = load_study(path)
        print(f"== {study.name}")
        rows = compare(args.stores, study, hardware, model, chosen)
        _print_tables(rows)
        print(_summary(rows, ""))
        every += rows
    if len(args.study or []) > 1:
        print(_summary(every, " of all the studies"))


def _print_tables(rows: list[TrialRow]) -> None:
    print("Step costs from each server.log (real) beside the model's step for the same batch and context:")
    print(f"{'#':>3}  {'prefill ktok/s':>15}  {'decode ms, graph':>16}  {'decode ms, eager':>16}")
    print(f"{'':>3}  {'real':>7} {'model':>7}  {'real':>7} {'model':>8}  {'real':>7} {'model':>8}")
    for r in rows:
        prefill = r.prefill_rates()
        graph, eager = r.decode_steps(True), r.decode_steps(False)
        print(
            f"{r.number:3d}  {_pair(prefill, 1e-3)}  {_pair(graph and graph[:2], 1e3)} "
            f" {_pair(eager and eager[:2], 1e3)}" + (f"  (eager batch {eager[2]})" if eager else "")
        )
    print()
    print("Memory at start-up, real (server.log) beside the model's plan:")
    print(f"{'#':>3}  {'KV pool tokens':>19}  {'GiB left after graphs':>21}")
    print(f"{'':>3}  {'real':>9} {'model':>9}  {'real':>10} {'model':>10}")
    for r in rows:
        if r.costs is None or r.costs.kv_tokens is None:
            continue
        plan = r.node.plan
        left = f"{r.costs.available_gib:10.2f}" if r.costs.available_gib is not None else f"{'-':>10}"
        model_left = plan.avail_after_graph_gb * GIB_PER_GB
        print(f"{r.number:3d}  {r.costs.kv_tokens:9d} {plan.kv_tokens:9d}  {left} {model_left:10.2f}")
    print()
    print(f"{'#':>3}  {'real state':10} {'real tok/s':>10} {'sim tok/s':>10} {'sim/real':>8}  sim failure")
    for r in rows:
        ratio = f"{r.sim / r.real:8.2f}" if r.real else f"{'-':>8}"
        shown = f"{r.real:10.1f}" if r.real is not None else f"{'-':>10}"
        print(f"{r.number:3d}  {r.state:10} {shown} {r.sim:10.1f} {ratio}  {r.sim_failure}")


if __name__ == "__main__":
    main()
