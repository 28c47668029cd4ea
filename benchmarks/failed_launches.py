"""Failed launches on a profile's model node, by kind, and the node hours they cost: peers/run.py's autotune
settings (40 trials, the profile's calibrated noise, a new lease every 10 launches, the NCCL stage, trust's
defaults) over seeds, with the launches the study made, the failed ones by failure kind, and the proposals
refused before a launch by why (known before launch: the GPU's architecture, the baseline's KV pool).

    python benchmarks/failed_launches.py --profile seed --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import NodeClock, Profile, load_profile, run_study

from autotune.config import Study
from autotune.sim.model.noise import SimNoise
from autotune.sim.profiles import load_hardware_profile
from autotune.study.records import FAILURE_ATTR, FAILURE_KIND_ATTR, SAME_AS_ATTR, SKIPPED_ATTR

N_TRIALS = 40  # peers/run.py's autotune settings
LEASE_EVERY = 10


def noise_of(profile: Profile) -> SimNoise:
    return SimNoise.calibrated(load_hardware_profile(profile.hardware).noise)


@dataclass(frozen=True)
class Spent:
    """One study: its launches and node hours, its failed launches by kind and what they cost, and the
    proposals refused before a launch by why."""

    launches: int
    node_h: float
    failed: Counter[str]
    failed_h: float
    refused: Counter[str]


def one_study(profile: Profile, seed: int) -> Spent:
    def inspect(study: Study, optuna_study: optuna.Study, clock: NodeClock, rerun: object) -> Spent:
        trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
        failed: Counter[str] = Counter()
        failed_s = 0.0
        for number, seconds in clock.seconds.items():
            trial = trials[number]
            if trial.state is not TrialState.COMPLETE:
                failed[str(trial.user_attrs.get(FAILURE_KIND_ATTR, trial.state.name))] += 1
                failed_s += seconds
        refused = Counter(
            "same launch"
            if SAME_AS_ATTR in t.user_attrs
            else str(t.user_attrs.get(FAILURE_ATTR)).split(":")[0]
            for t in trials.values()
            if t.user_attrs.get(SKIPPED_ATTR) and t.number not in clock.seconds
        )
        return Spent(len(clock.seconds), clock.total_s / 3600, failed, failed_s / 3600, refused)

    run = run_study(
        profile,
        N_TRIALS,
        seed=seed,
        noise=noise_of(profile),
        lease_every=LEASE_EVERY,
        nccl_stage=profile.tp > 1,
        trust=True,
        inspect=inspect,
    )
    spent: Spent = run.inspected
    return spent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--profile", default="seed", help="a shipped profile or a profile YAML (default seed)"
    )
    parser.add_argument("--seeds", type=int, default=5, help="studies, seeds 0..N-1 (default 5)")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    rows = []
    for seed in range(args.seeds):
        row = one_study(profile, seed)
        rows.append(row)
        print(
            f"seed {seed}: {row.launches} launches, {row.node_h:.2f} node h; failed {row.failed.total()} "
            f"({row.failed_h:.2f} h): {dict(row.failed)}; refused before launch: {dict(row.refused)}",
            flush=True,
        )
    median = statistics.median
    print(
        f"median over {len(rows)} seeds: {median(r.launches for r in rows):g} launches, "
        f"{median(r.node_h for r in rows):.2f} node h, {median(r.failed.total() for r in rows):g} failed "
        f"launches costing {median(r.failed_h for r in rows):.2f} node h "
        f"(in all: {sum(r.failed.total() for r in rows)} failed, {sum(r.failed_h for r in rows):.2f} h)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
