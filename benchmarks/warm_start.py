"""A re-tune after an SGLang upgrade, from scratch against `autotune run NEW.yaml --from OLD.yaml`: on a
profile's model node, a study on SGLang 0.5.17 (the simulated node's version, SGLANG_SIM_VERSION), then the
same study on 0.5.23 twice, without and with --from the first. Each with peers/run.py's autotune settings (40
trials, the profile's calibrated noise, a new lease every 10 launches, the NCCL stage, trust's defaults),
over seeds. For each: node hours in all, launches, node hours until its first launch within 2% of the earlier
study's answer (true values: the model without noise), and its own answer's true value against the best
known (benchmarks/best_known.json).

    python benchmarks/warm_start.py --profile seed --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import BENCHMARKS, NODE, Landscape, NodeClock, Profile, load_profile, write_study

from autotune.config import Study
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model.noise import SimNoise
from autotune.sim.model_node import node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.sim.versions import VERSION_ENV
from autotune.study.loop import StudyDriver
from autotune.study.rules import trial_config
from autotune.study.trust.answer import study_answer
from autotune.study.warm_start import read_earlier, start_from

N_TRIALS = 40  # peers/run.py's autotune settings
LEASE_EVERY = 10
WITHIN = 0.02
OLD_VERSION, NEW_VERSION = "0.5.17", "0.5.23"


@dataclass(frozen=True)
class Tune:
    """One study: node hours, launches, hours to a launch within WITHIN of `reference`, its answer."""

    node_h: float
    launches: int
    h_to_reference: float | None
    answer: float  # the true value of its answer's config
    verdict: str


def tune(
    profile: Profile, folder: Path, version: str, seed: int, landscape: Landscape, reference: float,
    from_study: Path | None = None,
) -> tuple[Study, Tune]:  # fmt: skip
    os.environ[VERSION_ENV] = version  # the simulated node's SGLang: its node check and every launch
    hardware, model = load_hardware_profile(profile.hardware), load_model_profile(profile.model)
    noise = SimNoise.calibrated(hardware.noise)
    clock = NodeClock(NODE, hardware, model, noise, noise_seed=seed, lease_every=LEASE_EVERY)

    def pool(_study: Study) -> NodePool:
        return LocalNodePool({NODE: clock}, {NODE: node_report(NODE, hardware, model)})

    folder.mkdir(parents=True)
    study = write_study(folder, profile, N_TRIALS, seed=seed, nccl_stage=profile.tp > 1, trust=True)
    if from_study is not None:
        start_from(study, read_earlier(from_study, study))
    optuna_study = StudyDriver(study, pool=pool).run()
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    spent, reached = 0.0, None
    numbers = list(clock.seconds)  # in the order they ran
    for number, seconds in zip(numbers, clock.launch_seconds(numbers), strict=True):
        spent += seconds
        trial = trials[number]
        good = (
            trial.state is TrialState.COMPLETE
            and landscape.value_of(trial_config(study, trial)) >= (1 - WITHIN) * reference
        )
        if good and reached is None:
            reached = spent / 3600
    answer = study_answer(optuna_study)
    value = landscape.value_of(trial_config(study, trials[answer.trial])) if answer is not None else 0.0
    verdict = answer.verdict if answer is not None else "none"
    return study, Tune(clock.total_s / 3600, len(clock.seconds), reached, value, verdict)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profile", default="seed", help="a shipped profile or a profile YAML (seed)")
    parser.add_argument("--seeds", type=int, default=5, help="re-tunes, seeds 0..N-1 (default 5)")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    best = json.loads((BENCHMARKS / "best_known.json").read_text())["profiles"][profile.key]["tok_s"]
    rows: list[tuple[Tune, Tune, Tune]] = []
    with tempfile.TemporaryDirectory(prefix="autotune-warm-") as root:
        os.environ[VERSION_ENV] = NEW_VERSION
        (Path(root) / "landscape").mkdir()
        landscape = Landscape(profile, Path(root) / "landscape")  # the truth, on the new version
        for seed in range(args.seeds):
            base = Path(root) / f"seed{seed}"
            old_study, old = tune(profile, base / "old", OLD_VERSION, seed, landscape, float("inf"))
            reference = old.answer
            cold = tune(profile, base / "new", NEW_VERSION, seed + 100, landscape, reference)[1]
            warm = tune(
                profile, base / "warm", NEW_VERSION, seed + 100, landscape, reference, old_study.path
            )[1]
            rows.append((old, cold, warm))
            for name, t in (("0.5.17", old), ("0.5.23 from scratch", cold), ("0.5.23 --from", warm)):
                print(
                    f"seed {seed} {name:<20} {t.node_h:5.2f} node h, {t.launches:2d} launches, within 2% of "
                    f"the earlier answer at {'-' if t.h_to_reference is None else f'{t.h_to_reference:.2f}'} "
                    f"h; "
                    f"answer {t.answer / best:.3f} of best known ({t.verdict})",
                    flush=True,
                )
    median = statistics.median
    for index, name in ((1, "from scratch"), (2, "--from")):
        tunes = [row[index] for row in rows]
        reached = [t.h_to_reference for t in tunes if t.h_to_reference is not None]
        print(
            f"0.5.23 {name:<13} median {median(t.node_h for t in tunes):.2f} node h, "
            f"{median(t.launches for t in tunes):g} launches, within 2% of the earlier answer at "
            f"{median(reached) if reached else float('nan'):.2f} h ({len(reached)}/{len(tunes)}), answer "
            f"{median(t.answer for t in tunes) / best:.3f} of best known "
            f"(min {min(t.answer for t in tunes) / best:.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
