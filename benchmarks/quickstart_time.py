"""Where the quickstart's time goes, for two commits side by side: each run is `time scripts/quickstart` in a
fresh clone (the install included), the runs alternating between the commits so that whatever else the
machine runs weighs on both alike.

    python benchmarks/quickstart_time.py --before 69fac4d --after HEAD --rounds 2
    python benchmarks/quickstart_time.py --parse run1.log run2.log   # tables of logs it wrote before

Each output line is stamped with the seconds since the start, so the phases are read from the console's
own headings: the install (scripts/bootstrap), autotune's and Ray's start, the NCCL stage, the search, the
confirmation rounds, and `autotune best --export`. Each run's log is kept (`--logs`), with the machine's
load average before and after it.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (phase, the first console line after it ends); the last phase ends at the end of the run.
PHASES: tuple[tuple[str, str], ...] = (
    ("install", "autotune: study "),
    ("autotune and Ray start", "== NCCL stage "),
    ("NCCL stage", "== study "),
    ("search (20 trials)", "== confirmation of "),
    ("confirmation", "study quickstart: "),
    ("best --export", "WALL "),
)


def run_once(rev: str, tag: str, logs: Path) -> Path:
    """Clone this repository at `rev` into a fresh folder, run scripts/quickstart there; its stamped log."""
    log = logs / f"{tag}.log"
    with tempfile.TemporaryDirectory(prefix=f"qs-{tag}-") as folder:
        clone = Path(folder) / "autotune"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
        with open(log, "w") as out:
            out.write(f"{0.0:7.1f} LOAD {os.getloadavg()[0]:.2f} {rev}\n")
            started = time.monotonic()
            process = subprocess.Popen(
                ["scripts/quickstart"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace",
            )
            assert process.stdout is not None
            for line in process.stdout:
                out.write(f"{time.monotonic() - started:7.1f} {line}")
            status = process.wait()
            elapsed = time.monotonic() - started
            out.write(f"{elapsed:7.1f} WALL {elapsed:.1f} s\n{elapsed:7.1f} RC {status}\n")
            out.write(f"{elapsed:7.1f} LOAD {os.getloadavg()[0]:.2f}\n")
    return log


def phases(log: Path) -> dict[str, float]:
    """Seconds of each phase of one stamped log, with `total`, `rc`, `load before` and `load after`."""
    stamped = []
    for raw in log.read_text(errors="replace").splitlines():
        stamp, _, text = raw.strip().partition(" ")
        try:
            stamped.append((float(stamp), text))
        except ValueError:
            continue
    out: dict[str, float] = {}
    begin = 0.0
    for name, marker in PHASES:
        end = next((t for t, text in stamped if text.startswith(marker) and t >= begin), None)
        if end is None:
            continue
        out[name] = end - begin
        begin = end
    for key, marker in (("total", "WALL "), ("rc", "RC ")):
        out[key] = next((float(text.split()[1]) for _, text in stamped if text.startswith(marker)), math.nan)
    # This script's LOAD lines, or `uptime`'s (logs of the shell loop that came before it).
    loads = [
        float(text.split()[1] if text.startswith("LOAD ") else text.split("load average:")[1].split(",")[0])
        for _, text in stamped
        if text.startswith("LOAD ") or "load average:" in text
    ]
    if loads:
        out["load before"], out["load after"] = loads[0], loads[-1]
    return out


def table(runs: dict[str, dict[str, float]]) -> str:
    """One column per run, one row per phase."""
    rows = [name for name, _ in PHASES] + ["total", "rc", "load before", "load after"]
    width = max(len(name) for name in runs) + 2
    lines = ["phase (s)".ljust(24) + "".join(name.rjust(width) for name in runs)]
    for row in rows:
        cells = [runs[name].get(row) for name in runs]
        lines.append(row.ljust(24) + "".join(("-" if c is None else f"{c:.1f}").rjust(width) for c in cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="the commit to compare against")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each commit, alternating")
    parser.add_argument("--logs", type=Path, default=Path("quickstart-time-logs"))
    parser.add_argument("--parse", nargs="+", type=Path, help="only print the table of these logs")
    args = parser.parse_args()
    if args.parse:
        stems = [log.stem for log in args.parse]
        names = [
            stem if stems.count(stem) == 1 else f"{log.parent.name}/{stem}"
            for stem, log in zip(stems, args.parse, strict=True)
        ]
        print(table({name: phases(log) for name, log in zip(names, args.parse, strict=True)}))
        return 0
    args.logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, float]] = {}
    for round_ in range(1, args.rounds + 1):
        for side, rev in (("before", args.before), ("after", args.after)):
            tag = f"{side}{round_}"
            runs[tag] = phases(run_once(rev, tag, args.logs))
            print(f"{tag}: {runs[tag]['total']:.1f} s", file=sys.stderr, flush=True)
    print(table(runs))
    for side in ("before", "after"):
        totals = [run["total"] for tag, run in runs.items() if tag.startswith(side)]
        print(f"{side}: median {statistics.median(totals):.1f} s over {len(totals)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
