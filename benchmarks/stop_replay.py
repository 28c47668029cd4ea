"""Stopping rules replayed on searches no rule stopped (issue 37 items 2/7).

A study's trials up to where a stopping rule stops it do not depend on the rule (the sampler does not read
it, and the baseline's repeats depend only on `min_noise_dof`), so one set of searches that spent their
whole budget (`benchmarks/trust.py --variants no-stop --dump DIR`) answers, for any rule: where it would
have stopped (the product's `why_stop` asked after every launch, as the study loop asks it), the node hours
to there, and what the answer would be worth (the true value of the product's best at the stop,
`rules.best_trial`, over the best known: the confirmation, which may pick the runner-up, is left out).

    python benchmarks/stop_replay.py DIR [--rules NAME,...]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_efficiency import BEST_KNOWN

from autotune.config.trust import StopEarly
from autotune.study.records import CONFIRM_ATTR
from autotune.study.rules import best_trial
from autotune.study.trust.stopping import why_stop

# The rules replayed: the study file's `stop_early` section of each (over the defaults: `min_patience` 8
# since session 12). The trials-* rules wait a fixed patience, as the defaults did before (`fixed-15`).
FIXED = {"min_patience": None}
RULES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "fixed-15": FIXED,
    "trials-20-12": {**FIXED, "patience": 12},
    "trials-20-10": {**FIXED, "patience": 10},
    "trials-16-12": {**FIXED, "min_trials": 16, "patience": 12},
    "trials-15-10": {**FIXED, "min_trials": 15, "patience": 10},
    "trials-12-8": {**FIXED, "min_trials": 12, "patience": 8},
    "grows-from-8": {"min_patience": 8},
    "grows-from-10": {"min_patience": 10},
    "hours-1.0": {"min_node_hours": 1.0, "patience_node_hours": 1.0},
    "hours-1.5": {"min_node_hours": 1.5, "patience_node_hours": 1.0},
}


class Prefix:
    """The study as the loop saw it after its first `k` launches: what `why_stop` reads of an Optuna study."""

    def __init__(self, trials: Sequence[FrozenTrial], attrs: Mapping[str, Any]) -> None:
        self._trials = list(trials)
        self.user_attrs = dict(attrs)
        self.direction = StudyDirection.MAXIMIZE
        self.directions = [self.direction]

    def get_trials(self, deepcopy: bool = False, states: Any = None) -> list[FrozenTrial]:
        return [t for t in self._trials if states is None or t.state in states]


@dataclass(frozen=True)
class Stop:
    launches: int  # launches before confirmation
    search_h: float  # node hours to the stop, the NCCL stage included
    worth: float  # the best's true value over the best known (0 where none is known)
    found_h: float  # node hours until the best's config (within 1%) was first launched


def replay(record: Mapping[str, Any], settings: StopEarly, best_known: float) -> Stop:
    """Where the rule stops the recorded search, and what its best is worth there."""
    trials = sorted(
        (t for t in record["trials"] if t.state.is_finished() and CONFIRM_ATTR not in t.user_attrs),
        key=lambda t: t.number,
    )
    seconds, true = record["seconds"], record["true"]
    attrs = {k: v for k, v in record["attrs"].items() if k != "stopped"}
    # The dumps are trust.py's throughput studies: no load search whose max could stop them (`at_load_max`).
    objective = SimpleNamespace(metric="output_throughput", load_search=None)
    trust = SimpleNamespace(stop_early=settings)
    study = SimpleNamespace(file=SimpleNamespace(trust=trust), objective=objective)
    end = len(trials)
    for k in range(1, len(trials) + 1):
        if why_stop(study, Prefix(trials[:k], attrs)) is not None:  # type: ignore[arg-type]
            end = k
            break
    prefix = trials[:end]
    best = best_trial(Prefix(prefix, attrs), prefix)  # type: ignore[arg-type]
    value = true.get(best.number, 0.0) if best is not None else 0.0
    spent, found = record["stage_s"], None
    for t in prefix:
        spent += seconds.get(t.number, 0.0)
        if found is None and true.get(t.number, 0.0) >= value * 0.99:
            found = spent
    return Stop(end, spent / 3600, value / best_known if best_known else 0.0, (found or spent) / 3600)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rules", default=",".join(RULES))
    args = parser.parse_args(argv)
    cached = json.loads(BEST_KNOWN.read_text())["profiles"] if BEST_KNOWN.exists() else {}
    records = [pickle.loads(p.read_bytes()) for p in sorted(args.folder.glob("*.pickle"))]
    names = args.rules.split(",")
    print(
        "| profile | landscape | rule | seeds | launches to the stop, median | node h to the stop, median "
        "| best / best known at the stop, median (min) | its config first launched at node h, median |"
    )
    print("|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, bool], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["profile"], record["flat"]), []).append(record)
    for (profile, flat), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        known = cached.get(profile, {}).get("tok_s", 0.0) if not flat else 0.0
        for name in names:
            settings = StopEarly.model_validate(RULES[name])
            stops = [replay(r, settings, known) for r in group]
            worth = [s.worth for s in stops]
            quality = f"{statistics.median(worth):.3f} ({min(worth):.3f})" if known else "-"
            print(
                f"| {profile} | {'flat' if flat else 'gains'} | {name} | {len(stops)} "
                f"| {statistics.median(s.launches for s in stops):.0f} "
                f"| {statistics.median(s.search_h for s in stops):.2f} | {quality} "
                f"| {statistics.median(s.found_h for s in stops):.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
