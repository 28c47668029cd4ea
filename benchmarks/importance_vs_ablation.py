"""The parameter-importance plot against ablation, on the same studies (issue 39.9).

For each seed: the quickstart's study (the seed's node and model, the shipped NCCL + SGLang + EAGLE-3
space, TPE) on the model of the node, in this process; then `autotune ablate`'s trials (the best config
with each changed setting reverted); then the importances of the search's trials, as the plot draws them
(fANOVA, conditional knobs filled) and as Optuna's default (PED-ANOVA over the parameters every trial has)
drew them before. Prints, per seed, what each reverted setting cost and each knob's importance under both.

    python benchmarks/importance_vs_ablation.py [--seeds 1 2 3] [--trials 20] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotune.config import Study, load_study
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.ablation import ablation_of, ablation_results, enqueue_ablation, plan_ablation
from autotune.study.loop import StudyDriver
from autotune.views.plots import param_importances, plot_data

REPO = Path(__file__).resolve().parents[1]
SWITCH = "--speculative-algorithm"


def study_file(folder: Path, seed: int, n_trials: int) -> Path:
    data = {
        "study": "importance",
        "search_space": str(REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"),
        "objective": str(REPO / "objectives" / "quickstart.yaml"),
        "server": {
            "command": ["python", "-m", "sglang.launch_server"],  # never launched: the model answers
            "model_path": "/models/Kimi-K2.5",
            "draft_model_path": "/models/Kimi-K2.5-EAGLE3",
            "flags": {"--tp-size": 8},
        },
        "nccl_stage": {"hidden_size": 7168},
        "sampler": {"name": "tpe", "seed": seed},
        "trust": False,
        "budget": {"n_trials": n_trials},
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def model_pool(_study: Study) -> NodePool:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    executor = ModelNodeExecutor("n", hw, model, noise=0.03)
    return LocalNodePool({"n": executor}, {"n": node_report("n", hw, model)})


def old_importances(optuna_study: optuna.Study) -> dict[str, float]:
    """What the plot drew before: Optuna's default evaluator over the parameters every trial has."""
    trials = [
        t for t in optuna_study.get_trials(deepcopy=False) if t.state.is_finished() and t.values and t.params
    ]
    common = set.intersection(*(set(t.params) for t in trials))
    varied = sorted(n for n in common if len({repr(t.params[n]) for t in trials}) > 1)
    return dict(optuna.importance.get_param_importances(optuna_study, params=varied))


def one_seed(seed: int, n_trials: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        path = study_file(Path(folder), seed, n_trials)
        optuna_study = StudyDriver(load_study(path), pool=model_pool, tracking=None).run()
        plan = plan_ablation(optuna_study)
        enqueue_ablation(optuna_study, plan)
        driver = StudyDriver(load_study(path), pool=model_pool, tracking=None, queued_only=True)
        optuna_study = driver.run(len(optuna_study.trials) + len(plan.reverts))
        ablation = ablation_results(optuna_study)
        search = optuna.create_study(direction="maximize")
        search.add_trials(
            [t for t in optuna_study.get_trials(deepcopy=False) if ablation_of(t, optuna_study) is None]
        )
        new = param_importances(plot_data(search, "output_throughput", "tok/s")) or {}
        return {"ablation": ablation, "new": new, "old": old_importances(search)}


def rank(importances: dict[str, float], name: str) -> str:
    names = sorted(importances, key=lambda n: -importances[n])
    return f"{names.index(name) + 1} of {len(names)}" if name in names else "left out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="one seed, 8 trials (a smoke run)")
    args = parser.parse_args()
    seeds, n_trials = ([1], 8) if args.quick else (args.seeds, args.trials)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for seed in seeds:
        found = one_seed(seed, n_trials)
        ablation, new, old = found["ablation"], found["new"], found["old"]
        base = f"{ablation.baseline_value:.1f}" if ablation.baseline_value is not None else "-"
        print(f"seed {seed}: best trial {ablation.of} {ablation.best_value:.1f} tok/s, baseline {base}")
        heads = f"{'ablation loss':>14} {'fANOVA (now)':>13} {'PED-ANOVA (before)':>19}"
        print(f"  {'setting of the best config':<34} {heads}")
        rows = sorted(ablation.rows, key=lambda r: -(r.loss if r.loss is not None else -1e9))
        shown = [r.param for r in rows] + [n for n in new if n not in {r.param for r in rows}][:3]
        for name in shown:
            row = next((r for r in rows if r.param == name), None)
            loss = f"{row.loss:+.1f} tok/s" if row is not None and row.loss is not None else "-"
            now = f"{new[name]:.3f}" if name in new else "-"
            before = f"{old[name]:.3f}" if name in old else "left out"
            print(f"  {name:<34} {loss:>14} {now:>13} {before:>19}")
        print(f"  {SWITCH}: rank {rank(new, SWITCH)} now, {rank(old, SWITCH)} before")


if __name__ == "__main__":
    main()
