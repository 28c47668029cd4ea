"""Start-up phases read from SGLang's own start-up lines (0.5.4, 0.5.17 on an H200, 0.5.23), as a trial
records them."""

from __future__ import annotations

import pytest

from autotune.node.startup_phases import StartupPhaseReader, startup_phases_text
from tests.node.test_logwatch import STARTUP, STARTUP_0517

# 0.5.23's decode graph line names its batch sizes at the end (cuda_graph_setup.py:788-792), on two ranks.
STARTUP_0523 = [
    "[2026-12-01 10:00:00 TP0] Init torch distributed begin.",
    "[2026-12-01 10:00:02 TP0] Init torch distributed ends. elapsed=1.87 s, mem usage=0.75 GB",
    "[2026-12-01 10:00:02 TP0] Load weight begin. avail mem=139.20 GB",
    "[2026-12-01 10:02:07 TP0] Load weight end. elapsed=125.40 s, type=Qwen3MoeForCausalLM, quant=fp8, "
    "avail mem=76.20 GB, mem usage=63.00 GB.",
    "[2026-12-01 10:02:09 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 903725, "
    "K size: 25.10 GB, V size: 25.10 GB",
    "[2026-12-01 10:02:10 TP0] Memory pool end. avail mem=24.71 GB",
    "[2026-12-01 10:02:10 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "avail mem=24.44 GB",
    "[2026-12-01 10:02:51 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=40.50 s, "
    "mem usage=0.30 GB, avail mem=24.14 GB.",
    "[2026-12-01 10:02:51 TP1] Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=40.61 s, "
    "mem usage=0.30 GB, avail mem=24.14 GB.",
    "[2026-12-01 10:02:58] The server is fired up and ready to roll!",
]


def _read(lines: list[str]) -> dict[str, float]:
    reader = StartupPhaseReader()
    for seen, line in enumerate(lines):
        if line != "{t}":
            reader.take(line, seen_s=float(seen))
    return reader.phases(ready_s=300.0)


def test_sglang_0517_phases_from_its_elapsed_figures_and_timestamps() -> None:
    phases = _read(STARTUP_0517)
    # Load weight end's elapsed=4.12; KV pool 10:00:09 -> 10:00:10; prefill 1.02 s + decode 72.68 s graphs.
    assert phases == {"weight_load_s": 4.12, "kv_pool_s": 1.0, "cuda_graph_s": 73.7, "ready_s": 300.0}


# SGLang 0.5.17's first presharded launch on an H100 (benchmarks/sglang-h200/presharded/, server-presharded-
# dump-call2.log): the shard bar's segments on one line (tqdm's carriage returns), then the dump, unlogged.
DUMPING_0517 = [
    "[2026-12-05 18:41:51] Init torch distributed begin.",
    "[2026-12-05 18:41:51] Init torch distributed ends. elapsed=0.03 s, mem usage=0.09 GB",
    "[2026-12-05 18:41:53] Load weight begin. avail mem=78.50 GB",
    "[2026-12-05 18:41:53] No presharded checkpoint at <tmp>/presharded/model-8b/TP-1-sig-4ae641df17b30f18; "
    "doing first-time load and dump.",
    "Multi-thread loading shards:   0% Completed | 0/4 [00:00<?, ?it/s]\rMulti-thread loading shards:  25% "
    "Completed | 1/4 [00:04<00:12,  4.24s/it]\rMulti-thread loading shards: 100% Completed | 4/4 "
    "[00:09<00:00,  1.97s/it]\r",
    "Multi-thread loading shards: 100% Completed | 4/4 [00:09<00:00,  2.41s/it]",
    "[2026-12-05 18:42:32] Load weight end. elapsed=38.52 s, type=LlamaForCausalLM, avail mem=65.00 GB, "
    "mem usage=13.51 GB.",
]


def test_a_presharded_launch_that_dumps_says_how_long_its_dump_took() -> None:
    # 38.52 s of weight load, the shards read in 9 s (the bar at 100%): 29.52 s of hashing and writing
    phases = _read(DUMPING_0517)
    assert phases["weight_load_s"] == 38.52 and phases["weight_dump_s"] == 29.52
    reload = [line for line in DUMPING_0517 if "No presharded" not in line]  # the same bar, no dump
    assert "weight_dump_s" not in _read(reload)
    assert startup_phases_text(phases) == "init 0 s, weights 39 s, other 261 s, ready 300 s"  # in weights


def test_sglang_0523_counts_each_graph_once_across_ranks() -> None:
    phases = _read(STARTUP_0523)
    assert phases == {
        "init_s": 1.87,
        "weight_load_s": 125.4,
        "kv_pool_s": 3.0,  # load end 10:02:07 -> memory pool end 10:02:10
        "cuda_graph_s": 40.5,  # TP0's, not TP0's and TP1's together
        "ready_s": 300.0,
    }


def test_sglang_054_without_elapsed_reads_the_log_clock() -> None:
    phases = _read(STARTUP)
    # No elapsed= on its load line: 11:50:33 -> 11:52:10 by the timestamps; the graph line's "Time elapsed".
    assert phases["weight_load_s"] == pytest.approx(97.0)
    assert phases["init_s"] == pytest.approx(1.0)
    assert phases["cuda_graph_s"] == 88.12
    assert phases["kv_pool_s"] == pytest.approx(1.0)


def test_lines_without_timestamps_use_when_they_were_seen() -> None:
    reader = StartupPhaseReader()
    reader.take("Load weight begin. avail mem=10 GB", seen_s=2.0)
    reader.take("Load weight end. type=X, avail mem=5 GB", seen_s=9.5)
    assert reader.phases() == {"weight_load_s": 7.5}


def test_text_names_the_phases_in_start_up_order() -> None:
    text = startup_phases_text({"ready_s": 714.2, "weight_load_s": 601.0, "cuda_graph_s": 67.4})
    assert text == "weights 601 s, CUDA graphs 67 s, other 46 s, ready 714 s"


def test_text_says_what_the_named_phases_leave_of_a_real_start_up() -> None:
    # A warm 8B start on the H200 (SGLang 0.5.17): 55 s to ready, 5 s of it in the phases SGLang logs.
    reader = StartupPhaseReader()
    for line in (
        "[2026-12-05 03:02:46] Init torch distributed ends. elapsed=0.04 s, mem usage=0.09 GB",
        "[2026-12-05 03:02:47] Load weight begin. avail mem=139.13 GB",
        "[2026-12-05 03:02:49] Load weight end. elapsed=1.94 s, type=LlamaForCausalLM, avail mem=125.62 GB, "
        "mem usage=13.51 GB.",
        "[2026-12-05 03:02:50] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 925293, "
        "K size: 56.48 GB, V size: 56.48 GB",
        "[2026-12-05 03:02:50] Memory pool end. avail mem=12.49 GB",
        "[2026-12-05 03:02:53] Capture target decode CUDA graph end. elapsed=2.36 s, "
        "mem usage=0.09 GB, avail mem=12.26 GB.",
    ):
        reader.take(line, seen_s=0.0)
    text = startup_phases_text(reader.phases(ready_s=54.49))
    assert text == "init 0 s, weights 2 s, KV pool 1 s, CUDA graphs 2 s, other 49 s, ready 54 s"
