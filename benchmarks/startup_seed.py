"""The seed profile's start-up, phase by phase, as the simulated node models it (autotune.sim.model.startup):
with the weights fitting the host's page cache and without, single-threaded (the seed's own SGLang) and with
SGLang 0.5.17's default 8 loader threads, the first launch on a node and every one after it, with the node's
compile cache kept across launches and without, with presharded weights, and with the part of the weights
the page cache can hold kept there before each launch (autotune.node.page_cache). Each figure is one SGLang
baseline launch on the model node (ModelNodeExecutor), read back from the trial's start-up phases as status
and MLflow show them.

    python benchmarks/startup_seed.py > benchmarks/startup_seed.txt

The seed does not say how much host memory its node has: the profile assumes 512 GB (the weights do not fit,
as its every ten-minute load suggests); 1024 GB is the case where they do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.measure.client import Workload
from autotune.node.startup_phases import STARTUP_PHASES
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import HardwareProfile, load_hardware_profile, load_model_profile
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest

LAUNCHES = 35  # the seed profile's median study (issue 37: about 35 launches of 714 s)
WORKLOAD = Workload(num_prompts=16, input_len=1000, output_len=200, concurrency=16)
SINGLE: dict[str, object] = {"enable_multithread_load": False}
THREADED: dict[str, object] = {"enable_multithread_load": True, "num_threads": 8}


def phases(
    hw: HardwareProfile,
    loader: dict[str, object] | None,
    compile_cache: bool,
    presharded: bool = False,
    keep: bool = False,
) -> list[dict[str, float]]:
    """The start-up phases of the first three baseline launches on one simulated node."""
    node = ModelNodeExecutor("seed", hw, load_model_profile("kimi-k2.5-int4"))
    flags: list[tuple[str, str | None]] = [("--model-path", "/models/Kimi-K2.5"), ("--tp-size", "8")]
    if loader is not None:
        flags.append(("--model-loader-extra-config", json.dumps(loader)))
    command = ("python", "-m", "sglang.launch_server")
    launch = ServerLaunch(command, {}, "127.0.0.1", 30000, flags=(*flags, ("--port", "30000")))
    out = []
    for number in (1, 2, 3):
        request = TrialRequest(
            number,
            launch,
            WORKLOAD,
            3600,
            3600,
            compile_cache=compile_cache,
            presharded_weights=presharded,
            weights_in_page_cache=keep,
        )
        result = node.run(request)
        assert result.ok, result.failure
        out.append(result.startup_phases)
    return out


def main() -> None:
    seed = load_hardware_profile("rtx-pro-6000-pcie-x8")
    cases: list[tuple[str, dict[str, object] | None, bool, bool, bool]] = [
        ("seed's SGLang: 1 loader thread, no cache folder", SINGLE, False, False, False),
        ("SGLang 0.5.17 default: 8 loader threads", None, False, False, False),
        ("autotune: 8 threads asked + compile cache kept", THREADED, True, False, False),
        ("autotune: + presharded weights", THREADED, True, True, False),
        ("autotune: + page cache's part kept (the default)", THREADED, True, True, True),
        ("autotune: 8 threads + cache + page cache's part", THREADED, True, False, True),
    ]
    names = [p.removesuffix("_s") for p in STARTUP_PHASES]
    print("Seed profile (Kimi-K2.5 INT4, 547 GB in 64 shards, 8x RTX PRO 6000): start-up seconds per phase.")
    print(f"`later`: every launch after the second on the same node; `study`: {LAUNCHES} launches' start-ups")
    print("with the node's page cache step before each (node time too).")
    print("Without a cache folder the simulated node compiles at every launch (a real node's default")
    print("~/.cache/sglang persists too, unless its home does not outlive the launch, as in a container).")
    print("SGLang's multithreaded loader maps the shards (their pages are the page cache's, measured on")
    print("0.5.17: RESULTS-sglang-h200.md), so its 8 threads stand on 512 GB; only where it is told to read")
    print("them into memory (--weight-loader-disable-mmap) does the node fit the threads (startup_prep).")
    print("Presharded weights (autotune.node.presharded) apply where the weights do not fit the page cache:")
    print("the first launch loads and writes each rank's share, every later one reads only its own share")
    print("(a read 8 ** 0.717 = 4.4x faster than one thread reading the whole checkpoint: vllm-ascend PR")
    print("6058's sharded_state figures; the dump 2.26x that read, as SGLang 0.5.17 took on one H100).")
    print("The page cache's part (autotune.node.page_cache): before each launch the node drops what the")
    print("launch reads beyond what 0.8 of MemAvailable holds beside the server, and reads that part in")
    print("once (from disk the first time a launch reads those files, else from memory); the launch reads")
    print("that share from memory. Kept: 0.8 x 491 GB - 8 ranks x 2.3 GB of the server's own (SGLang 0.5.17")
    print("at tp=1), less a mapped 8.5 GB shard per rank where the checkpoint is read; nothing before the")
    print("launch that writes the dump (it reads the checkpoint that once).")
    for memory in (512.0, 1024.0):
        hw = seed.model_copy(update={"host_memory_gb": memory})
        fits = "fit" if memory * 0.8 >= 547 else "do not fit"
        print(f"\nHost memory {memory:.0f} GB: the weights {fits} the page cache")
        print(f"{'case':<50} {'launch':<6} " + " ".join(f"{n:>11}" for n in names) + f" {'study h':>8}")
        for label, loader, cache, presharded, keep in cases:
            first, second, later = phases(hw, loader, cache, presharded, keep)
            node_s = [p["ready_s"] + p.get("page_cache_s", 0.0) for p in (first, second, later)]
            hours = (node_s[0] + node_s[1] + (LAUNCHES - 2) * node_s[2]) / 3600
            for which, p in (("first", first), ("second", second), ("later", later)):
                cells = " ".join(f"{p.get(n, 0.0):>11.1f}" for n in STARTUP_PHASES)
                tail = f" {hours:>8.2f}" if which == "first" else ""
                print(f"{label if which == 'first' else '':<50} {which:<6} {cells}{tail}")


if __name__ == "__main__":
    main()
