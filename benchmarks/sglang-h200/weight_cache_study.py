#!/usr/bin/env python3
"""What a study with `startup.weight_cache: true` did, trial by trial, and whether a daemon outlived it:
read from the study's own Optuna store (the records status and MLflow show), the node's process table and
nvidia-smi. weight_cache_study.sh runs it on the H200 after the study; it runs anywhere on a finished study.

    python3 benchmarks/sglang-h200/weight_cache_study.py \
        --study benchmarks/sglang-h200/weight-cache-study/study.yaml

Per trial: its settings, the fraction it was launched at (its own, or the matched f' for a client), the
weight load, the KV pool tokens, the node seconds and the notes; then each served trial's pool against a
disk-loaded trial of the same config (the baseline's config launched again: the f' check), and the daemons
left (processes whose command is a weight cache daemon, their ready files, nvidia-smi's compute apps).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import optuna
import yaml

MATCHED = re.compile(r"at --mem-fraction-static ([0-9.]+) for the KV pool of ([0-9.]+)")
DAEMON_COMMANDS = ("sglang.srt.weight_cache.daemon", "autotune.sim.weight_cache_daemon")


def daemons_left() -> list[str]:
    """Live processes running a weight cache daemon: 'pid pgid command'."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if any(name in command for name in DAEMON_COMMANDS) and "weight_cache_study.py" not in command:
            found.append(f"{proc.name} {stat[2]} {command.strip()[:160]}")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", type=Path, required=True, help="the study file")
    args = ap.parse_args()
    name = yaml.safe_load(args.study.read_text())["study"]
    storage = f"sqlite:///{args.study.resolve().parent / '.autotune' / name / 'optuna.db'}"
    trials = sorted(optuna.load_study(study_name=name, storage=storage).trials, key=lambda t: t.number)
    print(f"study {name}: {len(trials)} trials")
    head = f"{'trial':>5} {'state':<9} {'launched f':>10} {'load s':>7} {'KV tokens':>10} {'node s':>7}"
    print(f"{head}  settings")
    served: list[tuple[int, tuple[tuple[str, Any], ...], float | None]] = []
    disk: dict[tuple[tuple[str, Any], ...], tuple[int, float]] = {}
    for t in trials:
        u = t.user_attrs
        notes = [str(n) for n in u.get("startup_notes") or []]
        matched = next((m for n in notes if (m := MATCHED.search(n))), None)
        own = t.params.get("--mem-fraction-static")
        launched = matched.group(1) if matched else (own if own is not None else "SGLang's")
        load = (u.get("startup_phases") or {}).get("weight_load_s")
        tokens = (u.get("server_memory") or {}).get("kv_cache_tokens")
        node_s = u.get("node_s")
        key = tuple(sorted(t.params.items()))
        (served if matched else []).append((t.number, key, tokens))
        if not matched and tokens:
            disk.setdefault(key, (t.number, tokens))
        print(
            f"{t.number:>5} {t.state.name:<9} {launched!s:>10} {load if load is not None else '-'!s:>7} "
            f"{int(tokens) if tokens else '-'!s:>10} {round(node_s) if node_s else '-'!s:>7}  {t.params}"
        )
        for note in notes:
            print(f"{'':>7}{note}")
    print()
    for number, key, tokens in served:
        if key in disk and tokens:
            twin, disk_tokens = disk[key]
            print(
                f"trial {number} (a client) KV pool {int(tokens)} against trial {twin} (loaded from disk) "
                f"{int(disk_tokens)}: {tokens / disk_tokens - 1:+.3%}"
            )
    left = daemons_left()
    ready = sorted(str(p) for p in Path(tempfile.gettempdir()).glob("sglang_weight_cache_rank*.ready"))
    print(f"weight cache daemons left: {len(left)}" + "".join(f"\n  {line}" for line in left))
    print(f"ready files left: {ready or 'none'}")
    try:
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip()  # fmt: skip
        print(f"nvidia-smi compute apps after the study: {apps or 'none'}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"nvidia-smi: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
