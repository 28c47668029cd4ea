"""The best config for independent 28k prompts against the best for multi-turn sessions of the same lengths,
side by side on the same simulated node (the seed's: 8x RTX PRO 6000 over PCIe, Kimi-K2.5 INT4, 50x time).

Runs `examples/independent-28k.yaml` and `examples/agentic-sessions.yaml` (the same search space of the radix
cache's knobs, the same sampler seed, 12 trials, then each study's confirmation rounds against SGLang's
defaults) from a fresh state, then prints a Markdown table of each study's answer (`autotune best --json`)
and of the prefix cache every trial reported:

    python benchmarks/prefix_sessions.py            # about 15 minutes on a loaded 2-core machine
    python benchmarks/prefix_sessions.py --table    # the tables again, from the studies already run
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parent.parent
STUDIES = {"independent 28k prompts": "independent-28k", "multi-turn sessions": "agentic-sessions"}
TIMEOUT_S = 1800  # one study, its confirmation included


def run(name: str) -> float:
    """Run one example study from scratch; its wall seconds."""
    shutil.rmtree(REPO / "examples" / ".autotune" / name, ignore_errors=True)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "autotune", "run", f"examples/{name}.yaml"],
        cwd=REPO,
        check=True,
        timeout=TIMEOUT_S,
        stdout=subprocess.DEVNULL,
    )
    return time.monotonic() - started


def answer(name: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "best", f"examples/{name}.yaml", "--json"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def trials(name: str) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{REPO / 'examples' / '.autotune' / name / 'optuna.db'}"
    study = optuna.load_study(study_name=name, storage=storage)
    return [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _settings(params: dict[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(params.items()) if v is not None) or "defaults"


def main() -> None:
    rows, caches = [], []
    for label, name in STUDIES.items():
        seconds = None if "--table" in sys.argv else run(name)
        best = answer(name)
        low, high = best.get("gain_interval_pct") or [None, None]
        rows.append(
            f"| {label} | trial {best.get('trial')} | `{_settings(best.get('params') or {})}` | "
            f"{best.get('value') or 0:.1f} | {_pct(best.get('gain_pct'))} ({_pct(low)} to {_pct(high)}) | "
            f"{best.get('rounds')} | {'yes' if best.get('beats_defaults') else 'no'} | "
            f"{'-' if seconds is None else f'{seconds / 60:.1f} min'} |"
        )
        for trial in trials(name):
            cache = trial.user_attrs.get("prefix_cache") or {}
            if cache and trial.value is not None:
                caches.append(
                    f"| {label} | {trial.number} | `{_settings(trial.params)}` | {trial.value:.1f} | "
                    f"{cache['hit_rate']:.1%} | {cache['designed']:.1%} | "
                    f"{cache['ttft_first_turn_ms'] or 0:.0f} | {cache['ttft_later_turns_ms'] or 0:.0f} |"
                )
        print(f"{label}: {best.get('text')}", file=sys.stderr)
    # The gain is the leader's (the best config of the confirmation), the answer the defaults unless it won.
    print(
        "| workload | answer | its settings | output tok/s | leader's gain (CI) | rounds | beats defaults "
        "| wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("| workload | trial | settings | output tok/s | cache hit | designed | TTFT 1st turns ms | later |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(caches))


if __name__ == "__main__":
    main()
