"""Presharded weights (autotune.node.presharded): where a launch reads them, which launches share a dump,
and how the launch's flags carry it; the probe of the dump folder on the real local disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autotune.node.presharded import (
    DumpRoom,
    dump_folders,
    dump_note,
    dump_room,
    presharded_failure,
    presharded_launch,
    wants_presharded,
)
from autotune.node.runner import LocalCommandRunner
from autotune.node.startup_prep import HostMemory
from autotune.trial.launch import ServerLaunch, TrialConfig, build_server_launch
from autotune.trial.startup import LOAD_FORMAT_FLAG, LOADER_FLAG

GB = 10**9
SEED_MEMORY = HostMemory(486 * GB, round(547 * GB / 64), 547 * GB)  # 512 GB host, Kimi-K2.5's 547 GB
THREADS = {"enable_multithread_load": True, "num_threads": 4}
ROOT = "/node/presharded"


def _launch(**flags: str | None) -> ServerLaunch:
    base: dict[str, str | None] = {"--tp-size": "8", LOADER_FLAG: json.dumps(THREADS)}
    return build_server_launch(
        command=("python", "-m", "sglang.launch_server"),
        model_path="/models/Kimi-K2.5",
        config=TrialConfig(flags={k.replace("_", "-"): v for k, v in flags.items()}),
        host="127.0.0.1",
        port=30000,
        base_flags=base,
    )


def test_a_tensor_parallel_launch_whose_weights_outgrow_the_page_cache_wants_them() -> None:
    assert wants_presharded(_launch(), SEED_MEMORY)
    large_host = HostMemory(973 * GB, SEED_MEMORY.largest_shard_bytes, 547 * GB)  # 1 TB: the page cache holds
    assert not wants_presharded(_launch(), large_host)
    assert not wants_presharded(_launch(__tp_size="1"), SEED_MEMORY)  # one rank reads it all anyway
    assert not wants_presharded(_launch(__load_format="safetensors"), SEED_MEMORY)  # the user's own format
    assert not wants_presharded(_launch(__weight_cache_mode="client"), SEED_MEMORY)  # mapped, not loaded
    assert not wants_presharded(_launch(), None)  # a node that could not be probed
    assert not wants_presharded(_launch(), HostMemory(486 * GB, 0, 0))  # no *.safetensors in the model folder


def test_launches_differing_in_scheduling_and_speculation_share_one_dump_and_a_layout_gets_its_own() -> None:
    base = dump_folders(_launch(), ROOT)
    tuned = dump_folders(
        _launch(
            __mem_fraction_static="0.88",
            __chunked_prefill_size="8192",
            __speculative_algorithm="EAGLE3",
            __speculative_num_steps="3",
            __speculative_draft_model_path="/models/Kimi-K2.5-EAGLE3",
        ),
        ROOT,
    )
    assert tuned[0] == base[0] and base[0].startswith(ROOT + "/")
    assert tuned[1] != base[1]  # the draft model's dump is keyed by its path too
    assert dump_folders(_launch(__ep_size="8"), ROOT)[0] != base[0]  # experts laid out differently
    assert dump_folders(_launch(__moe_runner_backend="triton"), ROOT)[0] != base[0]  # unknown flags key too
    # The attention backends act on the KV cache: one dump serves them all (read back under torch_native
    # from a dump written under triton, real SGLang 0.5.17 gave the checkpoint's greedy text:
    # benchmarks/sglang-h200/presharded/backends-session-14-h100/).
    for backend in ("triton", "flashinfer", "fa3"):
        assert dump_folders(_launch(__attention_backend=backend), ROOT)[0] == base[0]
    assert dump_folders(_launch(__decode_attention_backend="triton"), ROOT)[0] == base[0]


def test_the_launch_loads_presharded_with_its_loader_settings_kept_and_a_short_disk_leaves_it_off() -> None:
    folders = dump_folders(_launch(), ROOT)
    launch, note = presharded_launch(_launch(), folders, SEED_MEMORY, DumpRoom(2000 * GB, ready=False))
    assert launch.flag(LOAD_FORMAT_FLAG) == "presharded"
    assert json.loads(launch.flag(LOADER_FLAG) or "") == {
        **THREADS,
        "presharded_path": folders[0],
        "draft_presharded_path": folders[1],
        "max_file_bytes": int(486 * GB * 0.1 / 8),
    }
    assert [f for f, _ in launch.flags].index(LOAD_FORMAT_FLAG) < [f for f, _ in launch.flags].index("--host")
    assert note is None  # the trial's note comes from what the server did (dump_note)
    assert presharded_launch(_launch(), folders, SEED_MEMORY, DumpRoom(10 * GB, ready=True)) == (launch, None)
    assert dump_note(launch) == (
        f"wrote a presharded dump of the weights to {folders[0]}: later launches of this model and layout "
        "read their own share of it instead of the checkpoint"
    )
    unchanged, why = presharded_launch(_launch(), folders, SEED_MEMORY, DumpRoom(500 * GB, ready=False))
    assert unchanged == _launch()
    assert why == (
        f"presharded weights left off: a dump of this layout needs 652 GB of disk and {folders[0]} has "
        "500 GB free (startup.presharded_weights: false stops trying)"
    )


def test_a_start_up_that_died_in_the_presharded_loader_is_told_from_one_that_died_elsewhere() -> None:
    """SGLang 0.5.17's own messages (loader.py), and an error raised inside its dump."""
    not_writable = (
        "RuntimeError: Presharded dump directory is not writable: /node/presharded/abc/TP-8-sig-1. Set "
        'model_loader_extra_config \'{"presharded_path": "..."}\' (or draft_presharded_path for the draft '
        "model) to a writable shared filesystem path. Original error: [Errno 13] Permission denied"
    )
    assert presharded_failure(f"Traceback (most recent call last):\n{not_writable}\n") == not_writable
    disk_full = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/model_loader/loader.py", line 2035, in '
        "_first_time_load_and_dump\n"
        "    self._dump_state_to_disk(state_dict, extras, presharded_dir, shard_config)\n"
        '  File "/usr/lib/python3/dist-packages/safetensors/torch.py", line 286, in save_file\n'
        "OSError: [Errno 28] No space left on device\n"
    )
    assert presharded_failure(disk_full) == "OSError: [Errno 28] No space left on device"
    loaded = (
        "No presharded checkpoint at /d/TP-8-sig-1; doing first-time load and dump.\n"
        "Loading from presharded checkpoint at /d/TP-8-sig-1\n"
        "Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/model_executor/model_runner.py", line 1, in init_memory_pool\n'
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    assert presharded_failure(loaded) is None


def test_a_dump_real_sglang_refused_is_read_from_its_own_log() -> None:
    """Real SGLang 0.5.17 (an H100, benchmarks/sglang-h200/presharded/failure-session-14-h100): a dump whose
    plan says another version; the failure table alone calls it an unknown crash, so this reader is what
    turns presharded weights off and runs the trial again without them."""
    log = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h100" / "presharded-plan-refused.log"
    assert presharded_failure(log.read_text()) == (
        "ValueError: Unsupported presharded plan version 99 at "
        "/tmp/presharded-failure/m/TP-1-sig-4ae641df17b30f18; expected 1."
    )


def test_dump_files_leave_the_page_cache_most_of_the_host() -> None:
    """Each rank holds one dump file in host memory while it writes or reads it (20 GiB by default): the
    ranks' files together are kept within a tenth of MemAvailable, the rest is the page cache's."""
    small = HostMemory(243 * GB, SEED_MEMORY.largest_shard_bytes, 547 * GB)  # a 256 GB host
    folders, room = dump_folders(_launch(), ROOT), DumpRoom(2000 * GB, False)
    launch, _ = presharded_launch(_launch(), folders, small, room)
    assert json.loads(launch.flag(LOADER_FLAG) or "")["max_file_bytes"] == int(243 * GB * 0.1 / 8)
    tiny = HostMemory(60 * GB, SEED_MEMORY.largest_shard_bytes, 547 * GB)
    launch, _ = presharded_launch(_launch(), folders, tiny, room)
    assert json.loads(launch.flag(LOADER_FLAG) or "")["max_file_bytes"] == 1024**3  # at least 1 GiB
    seed, _ = presharded_launch(_launch(), folders, SEED_MEMORY, room)
    assert json.loads(seed.flag(LOADER_FLAG) or "")["max_file_bytes"] == int(486 * GB * 0.1 / 8)
    big = HostMemory(2000 * GB, SEED_MEMORY.largest_shard_bytes, 2500 * GB)  # 8 x 20 GiB within 200 GB
    launch, _ = presharded_launch(_launch(), folders, big, room)
    assert "max_file_bytes" not in json.loads(launch.flag(LOADER_FLAG) or "")


@pytest.mark.integration
def test_the_probe_reads_the_real_disk_and_finds_a_finished_dump(tmp_path: Path) -> None:
    folder = tmp_path / "presharded" / "abc"
    room = dump_room(LocalCommandRunner(), str(folder))
    assert room is not None and not room.ready and folder.is_dir()
    assert room.free_bytes == pytest.approx(shutil.disk_usage(folder).free, rel=0.05)  # bytes, not KiB
    (folder / "TP-8-sig-0123456789abcdef").mkdir()
    (folder / "TP-8-sig-0123456789abcdef" / "READY").write_text("{}")
    again = dump_room(LocalCommandRunner(), str(folder))
    assert again is not None and again.ready


@pytest.mark.integration
def test_the_first_launch_of_a_layout_dumps_and_the_next_reads_its_own_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trials on one node, each a real simulated server started by the node: the first is told to dump
    (its log says SGLang's first-time line, its load takes the load and the dump), the second finds the
    dump on disk and reads it back (SGLang's reload line, the sharded read's time)."""
    import sys

    from autotune.measure.client import Workload
    from autotune.node import presharded
    from autotune.node.executor import TrialExecutor
    from autotune.node.runner import free_port
    from autotune.sim.model.startup import DUMP_OVER_READ, SHARDED_READ_EXPONENT
    from autotune.trial.wire import TrialRequest

    # A 1 kB checkpoint stands for one larger than this machine's page cache keeps.
    monkeypatch.setattr(presharded, "PAGE_CACHE_SHARE", 0.0)
    model = tmp_path / "Kimi-K2.5"  # no config.json: the simulated server serves the seed's model
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").write_bytes(b"x" * 1000)
    executor = TrialExecutor("local", LocalCommandRunner(), tmp_path / "node", port_wait_s=5)
    workload = Workload(num_prompts=2, input_len=100, output_len=8, concurrency=2)

    def run(number: int) -> tuple[dict[str, float], tuple[str, ...], str]:
        port = free_port()
        loader = json.dumps({"enable_multithread_load": False})
        flags: tuple[tuple[str, str | None], ...] = (("--model-path", str(model)), ("--tp-size", "8"))
        flags += ((LOADER_FLAG, loader),)
        flags += (("--host", "127.0.0.1"), ("--port", str(port)))
        command = (sys.executable, "-m", "autotune.sim.sglang_server")
        launch = ServerLaunch(command, {"SGLANG_SIM_TIME_SCALE": "0.001"}, "127.0.0.1", port, flags=flags)
        result = executor.run(TrialRequest(number, launch, workload, 60, 60, presharded_weights=True))
        assert result.ok, result.failure
        log = (tmp_path / "node" / f"trial-{number:04d}" / "server.log").read_text()
        return result.startup_phases, result.startup_notes, log

    (first, first_notes, first_log), (second, second_notes, second_log) = run(1), run(2)
    folder = str(tmp_path / "node" / "presharded")
    assert len(first_notes) == 1
    assert first_notes[0].startswith(f"wrote a presharded dump of the weights to {folder}/")
    assert second_notes == ()  # its faster load shows in its start-up phases
    assert "; doing first-time load and dump." in first_log and "Loading from presharded" not in first_log
    assert f"Loading from presharded checkpoint at {folder}/" in second_log
    # one thread over the whole checkpoint, then the dump; then the read of each rank's own share alone
    single = 547.0 / 0.91
    share = single / 8**SHARDED_READ_EXPONENT
    assert first["weight_load_s"] == pytest.approx(single + DUMP_OVER_READ * share, rel=0.01)
    assert second["weight_load_s"] == pytest.approx(share, rel=0.01) and "weight_dump_s" not in second
    # the dump's part, read from the shard bar's end (whole seconds)
    assert first["weight_dump_s"] == pytest.approx(DUMP_OVER_READ * share, abs=1.0)

    # A dump SGLang cannot read back (another plan version) fails the launch in its loader: the trial runs
    # again from the checkpoint, and presharded weights stay off on this node.
    (plan,) = (tmp_path / "node" / "presharded").glob("*/TP-8-sig-*/checksum.json")
    plan.write_text(json.dumps({"version": 99}))
    third, third_notes, third_log = run(3)
    failed = (tmp_path / "node" / "trial-0003" / "server-presharded.log").read_text()
    error = f"ValueError: Unsupported presharded plan version 99 at {plan.parent}; expected 1."
    assert error in failed
    assert third_notes[-1].startswith(f"presharded weights failed on this node ({error}): this trial ran")
    assert "presharded" not in third_log and third["weight_load_s"] == pytest.approx(single, rel=0.01)
    _, fourth_notes, _ = run(4)
    assert executor.presharded_failed is not None and not any("presharded" in n for n in fourth_notes)
