"""Node hours of a short study with the study file's `startup.weight_cache` off and on, same seeds, side by
side: the H100x8 profile (Qwen3-Coder-480B FP8, block-wise: a model SGLang's weight cache daemon serves) on
the model node (autotune.sim.model_node, the node's own weight cache rule with a daemon's costs modelled),
once with the node's 2 TB of host memory (the page cache keeps the 482 GB of weights between launches) and
once with 256 GB (every launch reads them from disk); on the shipped search space (speculative decoding and
--ep-size among its knobs: a launch the daemon cannot serve stops it, and the next one it can serve starts it
again) and on that space without them (every launch after the first two served).

    python benchmarks/weight_cache_hours.py [--trials 20] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_studies import StudyRun, load_profile, run_study, search_space_for

PROFILE = Path(__file__).resolve().parent / "profiles" / "h100x8-qwen3coder480b.yaml"
HOSTS = {"2 TB host (page cache)": None, "256 GB host (disk each launch)": 256}


def _hours(run: StudyRun) -> float:
    return sum(run.node_s) / 3600


def _answer(run: StudyRun) -> str:
    answer = run.answer or {}
    value = answer.get("value")
    return (
        f"{answer.get('verdict')} {value:.0f}"
        if isinstance(value, int | float)
        else str(answer.get("verdict"))
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    base = load_profile(str(PROFILE))
    shipped = search_space_for(base)
    served = {
        **shipped,
        "parameters": {
            k: v
            for k, v in shipped["parameters"].items()
            if not k.startswith("--speculative") and k != "--ep-size"
        },
    }
    print(f"{base.title}; {args.trials} trials, the product's trust defaults, seeds {args.seeds}")
    head = f"{'host, space':<50} {'seed':>4} {'launches':>8} {'off h':>7} {'on h':>7} {'on/off':>7}"
    print(f"{head}  answer off | on")
    with tempfile.TemporaryDirectory(prefix="wcache-hours-") as folder:
        cases = [
            (f"{host}, {name}", host_gb, space)
            for name, space in (("shipped space", shipped), ("no speculative, no --ep-size", served))
            for host, host_gb in HOSTS.items()
        ]
        for label, host_gb, space in cases:
            profile = base
            if host_gb is not None:
                hardware = yaml.safe_load(Path(base.hardware).read_text())
                hardware["host_memory_gb"] = host_gb
                path = Path(folder) / f"hardware-{host_gb}.yaml"
                path.write_text(yaml.safe_dump(hardware))
                profile = replace(base, hardware=str(path))
            total_off = total_on = 0.0
            for seed in args.seeds:
                off = run_study(
                    profile, args.trials, seed=seed, startup={"weight_cache": False}, search_space=space
                )
                on = run_study(
                    profile, args.trials, seed=seed, startup={"weight_cache": True}, search_space=space
                )
                total_off, total_on = total_off + _hours(off), total_on + _hours(on)
                print(
                    f"{label:<50} {seed:>4} {len(off.node_s):>3} {len(on.node_s):>4} {_hours(off):>7.2f} "
                    f"{_hours(on):>7.2f} {_hours(on) / _hours(off):>7.2f}  {_answer(off)} | {_answer(on)}",
                    flush=True,
                )
            ratio = total_on / total_off
            print(f"{label:<50} {'all':>4} {'':>8} {total_off:>7.2f} {total_on:>7.2f} {ratio:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
