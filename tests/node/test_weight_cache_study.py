"""Whole studies with `startup.weight_cache: true` on the simulated node (real processes: `autotune run
--no-ray`, the simulated servers and the simulated weight cache daemon): launches after the daemon starts map
the weights in 0.07 s with the KV pool of the same config loaded from disk (f' applied), a speculative trial
runs without the daemon (stopped, then started again), no daemon outlives the study, a quantized model is
told why and launches as usual, and the exported script is the plain launch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.processes import own_node_locks, side_by_side

pytestmark = pytest.mark.integration

SPACE = """parameters:
  --mem-fraction-static: {kind: sglang, type: categorical, choices: [0.82, 0.86]}
  --cuda-graph-max-bs-decode: {kind: sglang, type: categorical, choices: [32, 64]}
  --speculative-algorithm: {kind: speculative, type: categorical, choices: [null, EAGLE3]}
"""
OBJECTIVE = """name: wcache-throughput
metric: output_throughput
workload: {num_prompts: 8, input_len: 512, output_len: 32, concurrency: 4}
"""
STUDY = """study: {name}
search_space: space.yaml
objective: objective.yaml
nodes:
  - {{name: local, address: local, nvidia_smi: [python, -m, autotune.sim.nvidia_smi]}}
server:
  command: [python, -m, autotune.sim.sglang_server]
  model_path: {model_path}
  draft_model_path: {model_path}-EAGLE3
  model_weight_gb: {weight_gb}
  port: auto
  flags: {{--tp-size: 8}}
  env:
    SGLANG_SIM_HARDWARE: {hardware}
    SGLANG_SIM_MODEL: {model}
    SGLANG_SIM_TIME_SCALE: "0.02"
    SGLANG_SIM_STARTUP_TIME_SCALE: "0.002"
    SGLANG_SIM_WEIGHT_CACHE_DIR: {cache_dir}
nccl_stage: off
budget: {{n_trials: {n_trials}}}
sampler: {{name: random, seed: 3}}
timeouts: {{startup_s: 60, benchmark_s: 60}}
trust: {{confirm: off}}
startup: {{weight_cache: {weight_cache}}}
"""
LLAMA = {
    "model_path": "/models/Llama-70B",
    "weight_gb": 141,
    "hardware": "h200-nvlink-x8",
    "model": "llama-70b-bf16",
}
KIMI = {
    "model_path": "/models/Kimi-K2.5",
    "weight_gb": 547,
    "hardware": "rtx-pro-6000-pcie-x8",
    "model": "kimi-k2.5-int4",
}
DISK_LOAD_S = 141 / 2.5  # the 70B profile's load: 141 GB at 2.5 GB/s, in model seconds


def _study(
    root: Path, name: str, weight_cache: bool, n_trials: int, tracking: bool = False, **model: Any
) -> list[optuna.trial.FrozenTrial]:
    folder = root / name
    folder.mkdir()
    (folder / "space.yaml").write_text(SPACE)
    (folder / "objective.yaml").write_text(OBJECTIVE)
    cache_dir = folder / "weight-cache"
    text = STUDY.format(
        name=name, cache_dir=cache_dir, n_trials=n_trials, weight_cache=str(weight_cache).lower(), **model
    )
    (folder / "study.yaml").write_text(text)
    argv = [sys.executable, "-m", "autotune", "run", "study.yaml", "--no-ray"]
    done = subprocess.run(
        [*argv, *([] if tracking else ["--no-tracking"])],
        cwd=folder, capture_output=True, text=True, timeout=240, env=dict(os.environ, **own_node_locks()),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    storage = f"sqlite:///{folder / '.autotune' / name / 'optuna.db'}"
    trials = optuna.load_study(study_name=name, storage=storage).trials
    return [t for t in trials if t.user_attrs.get("startup_phases")]  # launched (not a same-launch skip)


def _daemon_pids(root: Path) -> list[int]:
    pids = []
    for log in sorted(root.rglob("weight-cache-daemon.log")):
        if "artifacts" in log.parts:  # MLflow's copy of a trial's log
            continue
        pids += [
            int(p) for p in re.findall(r"Launched weight cache daemon gpu=0 .*pid=(\d+)", log.read_text())
        ]
    return pids


def _notes(trial: optuna.trial.FrozenTrial) -> str:
    return " | ".join(trial.user_attrs.get("startup_notes") or [])


Studies = dict[str, list[optuna.trial.FrozenTrial]]


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Studies]:
    """The studies the tests below read, side by side (each takes 20 s, mostly waiting on its servers):
    one with the cache on and MLflow tracking, the same without the cache, and a quantized model's."""
    root = tmp_path_factory.mktemp("weight-cache")
    cached, plain, int4 = side_by_side(
        lambda: _study(root, "cached", True, 8, tracking=True, **LLAMA),
        lambda: _study(root, "plain", False, 8, **LLAMA),
        lambda: _study(root, "int4", True, 6, **KIMI),
    )
    return root, {"cached": cached, "plain": plain, "int4": int4}


def test_a_study_with_the_weight_cache_maps_the_weights_with_the_same_kv_pool(
    studies: tuple[Path, Studies],
) -> None:
    root, cached = studies[0], studies[1]["cached"]
    plain = {t.number: t for t in studies[1]["plain"]}
    served = [t for t in cached if "weights from the weight cache daemon" in _notes(t)]
    spec = [t for t in cached if t.params.get("--speculative-algorithm")]
    assert len(served) >= 2 and spec, [(t.number, t.params, _notes(t)) for t in cached]
    for trial in served:
        assert trial.user_attrs["startup_phases"]["weight_load_s"] == pytest.approx(0.07)
        # the same config loaded from disk, in the study without the cache: its pool to 0.1%
        twin = plain[trial.number]
        assert twin.params == trial.params and twin.user_attrs["startup_phases"]["weight_load_s"] > 50
        tokens, disk_tokens = (t.user_attrs["server_memory"]["kv_cache_tokens"] for t in (trial, twin))
        assert tokens == pytest.approx(disk_tokens, rel=1e-3)
        if "daemon started for this trial" not in _notes(trial):  # else the daemon's load is counted there
            assert trial.user_attrs["node_s"] < twin.user_attrs["node_s"] - 50
    for trial in spec:
        assert "does not serve speculative decoding" in _notes(trial)
        assert trial.user_attrs["startup_phases"]["weight_load_s"] > 50
    # The daemon started once for the first served launch and again for the first after a speculative one.
    started = [t.number for t in cached if "the weight cache daemon started for this trial" in _notes(t)]
    after_spec = [t.number for t in served if any(s.number < t.number for s in spec)]
    assert len(started) >= 2 and min(after_spec) in started
    first = next(t for t in cached if t.number == started[0])
    assert first.user_attrs["node_s"] > DISK_LOAD_S  # the daemon's load counts in its trial's node hours
    pids = _daemon_pids(root / "cached")
    assert len(pids) == len(started) and len(set(pids)) == len(pids)
    for pid in pids:  # no daemon left: neither its process nor its group, nor its ready files
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not list((root / "cached" / "weight-cache").glob("*.ready"))


def test_the_exported_launch_script_is_the_plain_launch_and_mlflow_keeps_the_daemon_log(
    studies: tuple[Path, Studies],
) -> None:
    folder = studies[0] / "cached"
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "best", "study.yaml", "--export", "best.sh"],
        cwd=folder, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    script = (folder / "best.sh").read_text()
    assert "--weight-cache-mode" not in script and "weight_cache" not in script
    artifacts = folder / ".autotune" / "cached" / "artifacts"
    logs = list(artifacts.glob("*/artifacts/weight-cache-daemon.log"))
    assert logs and "Loading model from disk" in logs[0].read_text()
    scripts = list(artifacts.glob("*/artifacts/launch.sh"))
    assert scripts and not any("--weight-cache-mode" in s.read_text() for s in scripts)  # each trial's own


def test_a_quantized_model_is_told_why_and_launches_as_usual(studies: tuple[Path, Studies]) -> None:
    root, trials = studies[0], studies[1]["int4"]
    refused = [t for t in trials if "refused this model" in _notes(t)]
    assert refused, [(t.number, _notes(t)) for t in trials]
    assert "its quantization 'compressed-tensors' is not one SGLang shares over CUDA IPC" in _notes(
        refused[0]
    )
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in refused)
    later = [
        t for t in trials if t.number > refused[0].number and not t.params.get("--speculative-algorithm")
    ]
    assert later and all("refused this model" in _notes(t) for t in later)  # the daemon is not tried again
    assert len(_daemon_pids(root / "int4")) == 1
    for pid in _daemon_pids(root / "int4"):
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
