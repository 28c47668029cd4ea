"""The simulated server beside the real one: every trial of a real study, its real tok/s and the model's.

Reads a study's stores as the GPU machine brought them back (`study.tar.gz`), rebuilds each trial's launch
from the study file, asks the simulated node's model (`autotune.sim.predict`) for the same launch on the
objective's workload, and prints both with the Spearman rank correlation and the median relative error
over the trials that completed on the real server.

    python benchmarks/sglang-h200/sim_vs_real.py benchmarks/sglang-h200/run2/study.tar.gz
"""

from __future__ import annotations

import argparse
import statistics
import tarfile
import tempfile
from pathlib import Path

import optuna
from scipy.stats import spearmanr

from autotune.config import load_study
from autotune.sim.predict import predict
from autotune.sim.profiles import StandardWorkload, load_hardware_profile, load_model_profile
from autotune.views.report import trial_config

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", type=Path, help="study.tar.gz: the study's .autotune/ folder, as brought back")
    ap.add_argument("--study", type=Path, default=REPO / "examples" / "sglang-h200.yaml")
    ap.add_argument("--hardware", default="h200-x1")
    ap.add_argument("--model", default="llama-8b-dummy")
    args = ap.parse_args()

    study = load_study(args.study)
    w = study.objective.workload
    if w is None:
        raise SystemExit(f"{args.study}: its objective has no workload to simulate")
    workload = StandardWorkload(
        num_prompts=w.num_prompts, input_len=w.input_len, output_len=w.output_len, concurrency=w.concurrency
    )
    hardware, model = load_hardware_profile(args.hardware), load_model_profile(args.model)
    skip = len(study.file.server.command)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.stores) as tar:
            tar.extractall(tmp, filter="data")
        db = Path(tmp) / ".autotune" / study.name / "optuna.db"
        trials = optuna.load_study(study_name=study.name, storage=f"sqlite:///{db}").get_trials()

    print(f"{'#':>3}  {'real state':10} {'real tok/s':>10} {'sim tok/s':>10} {'sim/real':>8}  sim failure")
    real, sim = [], []
    for t in trials:
        launch = study.server_launch(trial_config(study, t))
        p = predict(hardware, model, launch.argv[skip:], launch.env, workload)
        failure = (p.failure_line or "")[:60]
        real_value = t.value if t.state == optuna.trial.TrialState.COMPLETE else None
        ratio = f"{p.output_throughput / real_value:8.2f}" if real_value else f"{'-':>8}"
        shown = f"{real_value:10.1f}" if real_value is not None else f"{'-':>10}"
        print(f"{t.number:3d}  {t.state.name:10} {shown} {p.output_throughput:10.1f} {ratio}  {failure}")
        if real_value:
            real.append(real_value)
            sim.append(p.output_throughput)
    if len(real) >= 3:
        rho = spearmanr(real, sim).statistic
        error = statistics.median(abs(s - r) / r for r, s in zip(real, sim, strict=True))
        print(f"{len(real)} completed trials: Spearman {rho:.3f}, median relative error {error:.1%}")


if __name__ == "__main__":
    main()
