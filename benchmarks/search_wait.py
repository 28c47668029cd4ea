"""Why a search's answer comes late (issue 37 items 2/7), read from `benchmarks/trust.py --dump DIR`.

Per study (the first `--seeds` of each profile): the answer's first launch (the first search launch whose
true value lies within the study's final noise band of the answer's, as trust.py's `search_wait` counts it),
which part of the default sampler proposed it (the trial's PROPOSED_ATTR: a move, a line search, a branch
trial, a repair; none: TPE, or the start before it), its settings beyond SGLang's defaults, and what the
launches before it were spent on, by part. Then the moves up to that launch by kind, and how many raised the
value they moved from by more than 0.5%: moves of one knob, of two, and of a knob whose every move measured
so far lost more than 2% ("refuted"). Last, per profile and variant: the node hours to the first launch within
2% and 5% of the best known config (best_known.json).

    python benchmarks/search_wait.py DIR [--variant after] [--seeds 5] [--profile KEY ...]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import re
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_efficiency import BEST_KNOWN
from stop_replay import Prefix

from autotune.config.search_space import SpeculativeRules, same_value
from autotune.study.records import BASELINE_ATTR, CONFIRM_ATTR, TrialRecord
from autotune.study.samplers import TREE_KNOBS, _feasible, _moved_from
from autotune.study.trust.noise import noise_estimate

PROFILES = ("h200", "h100x4-llama70b", "h100x8-qwen3coder480b")  # the answers that come late
MOVE = re.compile(r"a move from trial (\d+), the best so far: (.*) changed")
GAIN = 0.005  # a move raised the value it moved from by more than this share (the line search's margin)
REFUTED_LOSS = 0.02  # a knob whose every move so far lost more than this share is refuted
SHORT = {
    "--disable-custom-all-reduce": "custom AR off",
    "--enable-torch-symm-mem": "torch symm-mem",
    "--enable-flashinfer-allreduce-fusion": "FlashInfer AR fusion",
    "--chunked-prefill-size": "chunk",
    "--cuda-graph-max-bs-decode": "graph bs",
    "--max-running-requests": "max running",
    "--attention-backend": "attention",
    "--ep-size": "EP",
}


def part(trial: FrozenTrial) -> str:
    """Which part of the default sampler proposed the trial (or the baseline's launch)."""
    if trial.user_attrs.get(BASELINE_ATTR):
        return "baseline"
    proposed = TrialRecord.of(trial).proposed
    if proposed is None:  # TPE records its relative params; the start draws each knob alone
        return "TPE" if any(k.startswith("tpe:") for k in trial.system_attrs) else "start"
    for prefix, name in (("a line search", "line search"), ("exploring", "branch"), ("a repair", "repair")):
        if proposed.startswith(prefix):
            return name
    moved = MOVE.match(proposed)
    if moved:
        knobs = {"tree" if k in TREE_KNOBS else k for k in moved.group(2).split(", ")}
        return "move" if len(knobs) == 1 else "move of 2 knobs"
    return "other"


def settings(params: Mapping[str, Any], chosen: float | None) -> str:
    """The settings beyond SGLang's defaults, the NCCL stage's held values aside."""
    out = []
    for name, value in params.items():
        if name.startswith("NCCL_") or value is None or value is False or name in TREE_KNOBS:
            continue
        if name == "--mem-fraction-static":
            out.append(f"fraction {value:.2f}" + (f" (SGLang's {chosen:.3f})" if chosen else ""))
        elif name == SpeculativeRules.ALGORITHM:
            steps, topk, draft = (params.get(n) for n in TREE_KNOBS)
            tree = f"{steps}/{topk}/{draft if topk and topk > 1 else (steps or 0) + 1}" if steps else ""
            out.append(f"{value} {tree}".strip())
        else:
            out.append(SHORT.get(name, name) + ("" if value is True else f" {value}"))
    return ", ".join(out)


def refuted(trials: Sequence[FrozenTrial], best: FrozenTrial) -> set[str]:
    """The knobs of `best` whose every move away from its value lost more than REFUTED_LOSS: a later trial
    that differs from an earlier measured one with the best's value in that knob alone (an EAGLE tree's
    knobs, or the algorithm with its tree, as one), measured worse or failed."""
    measured = [t for t in trials if _feasible(t)]
    best_change: dict[str, float] = {}
    for moved in (t for t in trials if t.params):
        for start in (t for t in measured if t.number < moved.number):
            changed = _moved_from(start, moved)
            if SpeculativeRules.ALGORITHM in changed and changed <= {SpeculativeRules.ALGORITHM, *TREE_KNOBS}:
                changed = {SpeculativeRules.ALGORITHM}
            if not changed or (len(changed) > 1 and not changed <= set(TREE_KNOBS)):
                continue
            if not all(same_value(start.params.get(n), best.params.get(n)) for n in changed):
                continue
            assert start.value is not None
            if _feasible(moved) and moved.value is not None and start.value:
                change = moved.value / start.value - 1
            else:
                change = -math.inf  # a failed launch: a loss as large as any
            for name in changed:
                best_change[name] = max(best_change.get(name, -math.inf), change)
    return {name for name, change in best_change.items() if change < -REFUTED_LOSS}


def first_launch(record: Mapping[str, Any]) -> tuple[list[FrozenTrial], int, float]:
    """The study's launches before confirmation, the index of the answer's first launch, and the node hours
    to it (the NCCL stage included)."""
    trials = sorted(
        (t for t in record["trials"] if t.state.is_finished() and CONFIRM_ATTR not in t.user_attrs),
        key=lambda t: t.number,
    )
    estimate = noise_estimate(Prefix(record["trials"], record["attrs"]))  # type: ignore[arg-type]
    band = estimate.band(spread_known=True) if estimate is not None else 0.01
    spent = record["stage_s"]
    for i, trial in enumerate(trials):
        spent += record["seconds"].get(trial.number, 0.0)
        search = not trial.user_attrs.get(BASELINE_ATTR)
        if search and record["true"].get(trial.number, 0.0) >= record["answer_true"] * (1 - band):
            return trials, i, spent / 3600
    return trials, len(trials) - 1, spent / 3600


def study_row(record: Mapping[str, Any]) -> str:
    trials, at, hours = first_launch(record)
    found = trials[at]
    chosen = record["attrs"].get("server_choices", {}).get("--mem-fraction-static")
    before = Counter(part(t) for t in trials[:at])
    spent = ", ".join(f"{name} {n}" for name, n in before.items())
    return (
        f"| {record['profile']} | {record['seed']} | {found.number}, {hours:.2f} | {part(found)} "
        f"| {settings(found.params, chosen)} | {spent} |"
    )


def move_outcomes(record: Mapping[str, Any]) -> Counter[tuple[str, bool]]:
    """The moves up to the answer's first launch: (kind, raised the value it moved from by > GAIN)."""
    trials, at, _ = first_launch(record)
    by_number = {t.number: t for t in trials}
    counted: Counter[tuple[str, bool]] = Counter()
    for i, trial in enumerate(trials[: at + 1]):
        moved = MOVE.match(TrialRecord.of(trial).proposed or "")
        if not moved or int(moved.group(1)) not in by_number:
            continue
        start = by_number[int(moved.group(1))]
        kind = "2 knobs" if part(trial) == "move of 2 knobs" else "1 knob"
        if _moved_from(start, trial) & refuted(trials[:i], start):
            kind += ", a refuted one"
        assert start.value is not None
        gained = _feasible(trial) and trial.value is not None and trial.value > start.value * (1 + GAIN)
        counted[(kind, gained)] += 1
    return counted


def hours_to(record: Mapping[str, Any], level: float) -> float | None:
    """Node hours to the first search launch whose true value is at least `level` (None: never)."""
    spent = record["stage_s"]
    for trial in sorted(record["trials"], key=lambda t: t.number):
        spent += record["seconds"].get(trial.number, 0.0)
        if CONFIRM_ATTR in trial.user_attrs or trial.user_attrs.get(BASELINE_ATTR):
            continue
        if record["true"].get(trial.number, 0.0) >= level:
            return float(spent) / 3600
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", type=Path, help="a benchmarks/trust.py --dump folder")
    parser.add_argument("--variant", default="after", help="the variant of the per-study tables")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per profile in the per-study table")
    parser.add_argument("--profile", action="append", help=f"profiles (default {', '.join(PROFILES)})")
    args = parser.parse_args(argv)
    chosen = args.profile or list(PROFILES)
    known = {k: v["tok_s"] for k, v in json.loads(BEST_KNOWN.read_text())["profiles"].items()}
    records = [pickle.loads(p.read_bytes()) for p in sorted(args.folder.glob("*-gains-*.pickle"))]
    records = [r for r in records if r["profile"] in chosen]
    records.sort(key=lambda r: (chosen.index(r["profile"]), r["variant"], r["seed"]))
    mine = [r for r in records if r["variant"] == args.variant]
    print(
        "| profile | seed | answer first launched: trial, node h | proposed by "
        "| its settings beyond SGLang's defaults (the NCCL stage's aside) | launches before it, by part |"
    )
    print("|---|---|---|---|---|---|")
    for record in (r for r in mine if r["seed"] < args.seeds):
        print(study_row(record))
    print(
        "\n| profile | seeds | moves up to the answer's first launch: kind | moves "
        "| raised the value > 0.5% |"
    )
    print("|---|---|---|---|---|")
    for profile in chosen:
        group = [r for r in mine if r["profile"] == profile]
        total: Counter[tuple[str, bool]] = sum((move_outcomes(r) for r in group), Counter())
        for kind in sorted({k for k, _ in total}):
            n, gained = total[(kind, False)] + total[(kind, True)], total[(kind, True)]
            print(f"| {profile} | {len(group)} | {kind} | {n} | {gained} ({gained / n:.0%}) |")
    print(
        "\n| profile | variant | seeds | node h to a launch within 2% of the best known: median (reached) "
        "| within 5%: median (reached) |"
    )
    print("|---|---|---|---|---|")
    for profile in chosen:
        for variant in dict.fromkeys(r["variant"] for r in records):
            group = [r for r in records if r["profile"] == profile and r["variant"] == variant]
            if not group or profile not in known:
                continue
            cells = []
            for share in (0.98, 0.95):
                hours = [hours_to(r, share * known[profile]) for r in group]
                median = statistics.median(h if h is not None else math.inf for h in hours)
                shown = f"{median:.2f}" if median < math.inf else "not reached"
                cells.append(f"{shown} ({sum(h is not None for h in hours)}/{len(group)})")
            print(f"| {profile} | {variant} | {len(group)} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
