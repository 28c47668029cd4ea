"""The harness that runs SGLang's auto_benchmark against the simulated node (benchmarks/peers/): what
auto_benchmark launches and measures reaches the model node intact, flags, environment and workload alike,
and what the node answers comes back in the form auto_benchmark reads. No process starts; SGLang's own code
is not needed (the launch and benchmark command lines are written here as auto_benchmark writes them)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.builders import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "peers"))

import harness
from model_studies import NODE, PROFILES, NodeClock

from autotune.measure.workloads import Workload
from autotune.sim.predict import settings_for
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.trial.wire import TrialRequest, TrialResult

SEED = PROFILES["seed"]
WORKLOAD = Workload(num_prompts=8, input_len=28000, output_len=1000, concurrency=4, warmup_requests=1)


class RecordingClock(NodeClock):
    """The seed profile's model node, keeping every request it was asked to run."""

    def __init__(self) -> None:
        super().__init__(NODE, load_hardware_profile(SEED.hardware), load_model_profile(SEED.model))
        self.requests: list[TrialRequest] = []
        self.results: list[TrialResult] = []

    def run(self, request: TrialRequest) -> TrialResult:
        self.requests.append(request)
        self.results.append(super().run(request))
        return self.results[-1]


def launch_command(**flags: Any) -> list[str]:
    """`python -m sglang.launch_server` with `flags` written as auto_benchmark's cli_args writes them
    (--model-path wherever the config put it: last here, after the cookbook's baseline flags)."""
    argv = [sys.executable, "-m", harness.LAUNCH_SERVER]
    for key, value in flags.items():
        flag = f"--{key.replace('_', '-')}"
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def bench_command(tmp_path: Path, rows: list[dict[str, Any]], concurrency: int) -> list[str]:
    dataset = tmp_path / "prepared_dataset.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return [
        sys.executable, "-m", harness.BENCH_SERVING[0], "--backend", "sglang",
        "--base-url", "http://127.0.0.1:30000", "--dataset-name", "autobench", "--dataset-path", str(dataset),
        "--num-prompts", str(len(rows)), "--request-rate", "inf",
        "--output-file", str(tmp_path / "bench.jsonl"),
        "--max-concurrency", str(concurrency), "--warmup-requests", "1",
    ]  # fmt: skip


def test_candidate_flags_env_and_workload_reach_the_model_node_intact(tmp_path: Path) -> None:
    clock = RecordingClock()
    node = harness.ModelSubprocess(clock, WORKLOAD)
    command = launch_command(
        tp_size=8,
        trust_remote_code=True,
        mem_fraction_static=0.83,
        schedule_policy="lpm",
        chunked_prefill_size=4096,
        max_running_requests=32,
        model_path=SEED.model_path,
        host="127.0.0.1",
        port=30000,
    )
    with open(tmp_path / "server.log", "w") as log:
        node.Popen(command, stdout=log, env={**os.environ, "NCCL_ALGO": "Ring"}, start_new_session=True)
        rows = [{"prompt": [1] * 28000, "prompt_len": 28000, "output_len": 1000}] * 8
        done = node.run(bench_command(tmp_path, rows, concurrency=4), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    (request,) = clock.requests
    argv = list(request.launch.argv)
    settings = settings_for(argv[argv.index("--model-path") :], request.launch.env)
    assert (settings.tp_size, settings.mem_fraction_static) == (8, 0.83)
    assert (settings.chunked_prefill_size, settings.max_running_requests) == (4096, 32)
    assert settings.nccl.algo == "Ring"
    assert request.launch.env == {"NCCL_ALGO": "Ring"}  # only what auto_benchmark added to the environment
    # auto_benchmark gets autotune's loading settings, as typed flags the node fits to the host's memory
    # where SGLang reads the shards into it; it maps them here, so 8 threads load the seed's weights on its
    # 512 GB node, as for autotune's launches (150 s)
    assert (
        request.launch.flag("--model-loader-extra-config")
        == '{"enable_multithread_load": true, "num_threads": 8}'
    )
    assert request.launch.flag("--tp-size") == "8" and request.launch.flag("--trust-remote-code") is None
    assert request.workload == Workload(
        num_prompts=8, input_len=28000, output_len=1000, concurrency=4, warmup_requests=1
    )

    record = json.loads((tmp_path / "bench.jsonl").read_text().splitlines()[-1])
    assert record["output_throughput"] > 0 and record["mean_ttft_ms"] > 0 and record["mean_tpot_ms"] > 0
    (launch,) = node.launches
    assert not launch.failed and launch.seconds > 60  # the model's start-up and benchmark, in node seconds
    assert clock.results[0].startup_phases["weight_load_s"] == pytest.approx(547 / 0.91 / 4.0, 0.01)
    assert node.time.time() == 1.8e9 + launch.seconds  # auto_benchmark's clock moved by them


def test_a_failed_launch_reaches_auto_benchmark_as_a_failed_benchmark_with_its_log(tmp_path: Path) -> None:
    node = harness.ModelSubprocess(RecordingClock(), WORKLOAD)
    command = launch_command(model_path=SEED.model_path, tp_size=8, mem_fraction_static=0.99)
    with open(tmp_path / "server.log", "w") as log:
        node.Popen(command, stdout=log, env=dict(os.environ))
        rows = [{"prompt": [1] * 28000, "prompt_len": 28000, "output_len": 1000}] * 8
        done = node.run(bench_command(tmp_path, rows, concurrency=4), capture_output=True, text=True)
    assert done.returncode == 1 and "server failed" in done.stderr
    assert node.launches[0].failed
    assert "memory" in (tmp_path / "server.log").read_text().lower()  # what auto_benchmark's OOM hint reads


def test_the_config_keeps_the_cookbook_entry_with_the_profiles_layout_and_workload(tmp_path: Path) -> None:
    config = harness.auto_benchmark_config(PROFILES["h200"], WORKLOAD, harness.VARIANTS[0], tmp_path)
    entry = harness.COOKBOOK["llama-3.1-70b-instruct"]
    server = config["server"]
    assert list(server["search_space"]) == list(entry.search_space)  # its order decides the tiers
    assert server["base_flags"]["tp_size"] == 8  # the node's 8 GPUs, as autotune's study uses them
    assert server["base_flags"]["mem_fraction_static"] == entry.base_flags["mem_fraction_static"]
    assert config["search"] == {"tier": 2, "max_candidates": 8, "resume": False}
    assert config["benchmark"]["max_concurrency"] == [WORKLOAD.concurrency]
    assert config["benchmark"]["qps"] == float("inf")
    assert not config["speculative"]["enabled"]


def test_the_moe_coder_profile_runs_auto_benchmark_with_its_own_cookbook_entry(tmp_path: Path) -> None:
    """Every benchmarks/profiles/*.yaml runs in run.py: the Qwen3-Coder profile with SGLang's entry for that
    model, whose base flags (expert parallelism 2, the Triton MoE runner) and searched memory fraction reach
    the model node and start there."""
    from model_studies import load_profile

    profile = load_profile(str(REPO / "benchmarks" / "profiles" / "h100x8-qwen3coder480b.yaml"))
    workload = Workload(num_prompts=4, input_len=12000, output_len=400, concurrency=4, warmup_requests=1)
    config = harness.auto_benchmark_config(profile, workload, harness.VARIANTS[0], tmp_path)
    server = config["server"]
    assert server["base_flags"]["ep_size"] == 2 and server["base_flags"]["tp_size"] == 8
    assert server["search_space"]["mem_fraction_static"] == [0.82, 0.85, 0.88]
    assert config["search"]["max_candidates"] == 24

    clock = NodeClock(NODE, load_hardware_profile(profile.hardware), load_model_profile(profile.model))
    node = harness.ModelSubprocess(clock, workload)
    flags = {**server["base_flags"], "mem_fraction_static": 0.88, "chunked_prefill_size": 8192}
    command = launch_command(**flags, prefill_attention_backend="flashinfer", host="127.0.0.1", port=30000)
    with open(tmp_path / "server.log", "w") as log:
        node.Popen(command, stdout=log, env=dict(os.environ))
        rows = [{"prompt": [1] * 12000, "prompt_len": 12000, "output_len": 400}] * 4
        done = node.run(bench_command(tmp_path, rows, concurrency=4), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + (tmp_path / "server.log").read_text()[-2000:]
    assert not node.launches[0].failed


def test_the_seed_runs_with_its_weights_in_the_page_cache_and_without() -> None:
    """The seed does not say how much host memory its node has: peers/run.py runs its profile on 512 GB
    (547 GB of weights do not fit the page cache) and on 1024 GB (they do), the node otherwise the same."""
    import run as peers
    from startup_seed import phases

    from autotune.sim.model.startup import weights_fit_page_cache

    keys = [p.key for p in peers.profiles(quick=False)]
    assert keys[:2] == ["seed", "seed-1tb-host"]
    assert all(key in harness.PROFILE_COOKBOOK for key in keys)  # auto_benchmark's entry for each
    fitting = peers.load_profile(str(peers.SEED_PAGE_CACHE))
    shipped = load_hardware_profile(SEED.hardware).model_dump()
    variant = load_hardware_profile(fitting.hardware).model_dump()
    assert {k for k in shipped if shipped[k] != variant[k]} == {"name", "host_memory_gb"}
    assert (shipped["host_memory_gb"], variant["host_memory_gb"]) == (512, 1024)
    model = load_model_profile(fitting.model)
    assert not weights_fit_page_cache(load_hardware_profile(SEED.hardware), model)
    assert weights_fit_page_cache(load_hardware_profile(fitting.hardware), model)
    # The second launch on the node reads the weights from memory there, from disk on 512 GB.
    later_plain = phases(load_hardware_profile(SEED.hardware), None, True)[1]["weight_load_s"]
    later_fitting = phases(load_hardware_profile(fitting.hardware), None, True)[1]["weight_load_s"]
    assert later_fitting < later_plain / 4


def test_autotune_given_a_node_hour_budget_ends_within_it_and_its_row_says_so() -> None:
    """The row "autotune given 2x ab-tier2's node hours": the budget reaches the study file
    (`budget: {node_hours: H}`), the study ends within it with an answer, and the row gives its worth,
    its node hours and whether it was confirmed."""
    import run as peers

    h200 = PROFILES["h200"]
    done = peers.run_autotune_job(peers.Job(h200, peers.BUDGETED, 0, 40), node_hours=0.42)
    assert done.budget_h == 0.42 and 0 < done.node_h <= 0.42 and done.true_value > 0
    assert done.note in ("confirmed", "unconfirmed")
    free = peers.run_autotune_job(peers.Job(h200, peers.AUTOTUNE, 0, 40))
    assert free.budget_h is None and free.node_h > 0.42  # the budget is what ended it
    row = peers.budgeted([done, free], {"h200": 4000.0})[2]
    confirmed = "1/1" if done.note == "confirmed" else "0/1"
    worth = f"{done.true_value / 4000:.3f}"
    spent = f"{done.node_h:.2f} ({done.node_h:.2f})"
    assert row == f"| h200 | 1 | 0.42 | {spent} | 1/1 | {worth} ({worth}) | {confirmed} |"
