"""A seeded study on the simulated node runs the same on a rerun, trial by trial: the server's noise is
seeded from the study's seed and the trial (SGLANG_SIM_SEED, set by the study), not from the OS; its
batches do not depend on when a client's request happened to arrive (autotune.sim.server.serving); and the
client times it by the server's model clock, not by a wall clock that a busy machine makes late by seconds
of server time at 50x. So every measurement repeats to the last digit, and TPE takes the same path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.builders import REPO
from tests.conftest import run_cli
from tests.processes import own_node_locks, side_by_side

pytestmark = pytest.mark.integration  # the study's servers are processes

TRIALS = 11  # TPE starts with 10 trials: the 11th is proposed from the values measured
STUDY = f"""
study: seeded
search_space: {REPO / "search_spaces" / "one-gpu.yaml"}
objective: objective.yaml
nodes:
  - {{name: local, address: local, nvidia_smi: [python, -m, autotune.sim.nvidia_smi]}}
server:
  command: [python, -m, autotune.sim.sglang_server]
  model_path: /models/llama-8b
  model_weight_gb: 14.5
  port: auto
  env:
    SGLANG_SIM_HARDWARE: h200-x1
    SGLANG_SIM_MODEL: llama-8b-dummy
    SGLANG_SIM_TIME_SCALE: "0.02"  # the quickstart's 50x: a client late by 10 ms is 0.5 s of server time
    SGLANG_SIM_STARTUP_TIME_SCALE: "0.001"
    SGLANG_SIM_NOISE: "0.03"
budget: {{n_trials: {TRIALS}}}
sampler: {{name: tpe, seed: 7}}
trust: off
"""
# A closed loop (6 requests, 2 at a time): each ending request is answered by the client with the next one.
OBJECTIVE = """
name: small-throughput
metric: output_throughput
workload: {num_prompts: 6, input_len: 2048, output_len: 256, concurrency: 2, warmup_requests: 1}
"""
SEED_IN_LOG = re.compile(r"random_seed=(\d+)")


def _run(folder: Path) -> tuple[list[dict[str, object]], list[str], dict[str, object]]:
    folder.mkdir()
    (folder / "study.yaml").write_text(STUDY)
    (folder / "objective.yaml").write_text(OBJECTIVE)
    ran = run_cli("run", "study.yaml", "--no-ray", "--no-tracking", cwd=folder, env=own_node_locks())
    assert ran.returncode == 0, ran.stderr
    trials = json.loads(run_cli("status", "study.yaml", "--json", cwd=folder).stdout)["trials"]
    best = json.loads(run_cli("best", "study.yaml", "--json", cwd=folder).stdout)
    logs = sorted((folder / ".autotune" / "seeded" / "nodes" / "local").glob("trial-*/server.log"))
    seeds = [m.group(1) for log in logs if (m := SEED_IN_LOG.search(log.read_text()))]
    return trials, seeds, best


def test_a_seeded_simulated_study_runs_the_same_on_a_rerun(tmp_path: Path) -> None:
    # The two runs side by side: each loads the machine as a busy one would, which must change nothing.
    (first, first_seeds, first_best), (second, second_seeds, second_best) = side_by_side(
        lambda: _run(tmp_path / "first"), lambda: _run(tmp_path / "second")
    )
    assert len(first) == len(second) == TRIALS and len(first_seeds) == TRIALS
    # The same launches, each with the same noise: the seed the server drew its noise from.
    assert first_seeds == second_seeds and len(set(first_seeds)) == TRIALS
    assert [t["state"] for t in first] == ["COMPLETE"] * TRIALS
    # The same configs, in the same trials, measured the same to the last digit (a wall clock differed in
    # the second or third digit), so TPE's proposal after its start is the same too.
    assert [(t["number"], t["params"], t["value"]) for t in first] == [
        (t["number"], t["params"], t["value"]) for t in second
    ]
    assert first_best == second_best
