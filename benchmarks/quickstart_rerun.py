"""Two runs of the quickstart side by side, trial by trial: does a seeded simulated study rerun the same?

    python benchmarks/quickstart_rerun.py CLONE_A CLONE_B CONSOLE_A CONSOLE_B

Each CLONE is a clone of this repository in which `scripts/quickstart` ran (its console saved to CONSOLE).
Prints each run's answer lines, then every trial's state, value (to the last digit) and parameters from
`autotune status --json` of both, and how many are identical.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ANSWER_LINES = ("study quickstart:", "baseline output_throughput", "answer:", "        output_throughput")


def trials(clone: str) -> list[dict[str, Any]]:
    status = [f"{clone}/.venv/bin/autotune", "status", "examples/quickstart.yaml", "--json"]
    done = subprocess.run(status, cwd=clone, capture_output=True, text=True, check=True)
    found: list[dict[str, Any]] = json.loads(done.stdout)["trials"]
    return found


def main(clones: list[str], consoles: list[str]) -> None:
    runs = [trials(clone) for clone in clones]
    for name, console in zip("ab", consoles, strict=True):
        print(f"== run {name}")
        lines = Path(console).read_text().splitlines()
        print("\n".join(line for line in lines if line.startswith(ANSWER_LINES)))
    print("== per trial (status --json of both runs): state and value of run a | of run b")
    same = 0
    for a, b in zip(*runs, strict=False):
        identical = (a["state"], a["value"], a["params"]) == (b["state"], b["value"], b["params"])
        same += identical
        values = ["-" if t["value"] is None else repr(t["value"]) for t in (a, b)]
        print(
            f"trial {a['number']:2d}: {a['state']:9s} {values[0]:>20s} | {b['state']:9s} {values[1]:>20s}  "
            f"{'identical' if identical else 'DIFFERENT'}"
        )
    counts = f"{same} of {len(runs[0])} and {len(runs[1])} trials"
    print(f"{counts} identical (state, value to the last digit, params)")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1:3], sys.argv[3:5])
