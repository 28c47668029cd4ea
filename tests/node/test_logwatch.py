"""wait_until_ready and LogFollower against real processes that print SGLang's start-up lines."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.node.logwatch import LogFollower, StartupStatus, server_choices, wait_until_ready
from autotune.node.runner import LocalCommandRunner, ServerProcess
from autotune.trial.failures import FailureKind

# SGLang 0.5.4's start-up lines, in order, with its log prefix; `{t}` marks where a script sleeps.
STARTUP = [
    "[2026-02-27 11:50:30] server_args=ServerArgs(model_path='/models/m', tp_size=2, enable_nccl_nvls=False)",
    "[2026-02-27 11:50:31 TP0] Init torch distributed begin.",
    "[2026-02-27 11:50:32 TP0] Init torch distributed ends. mem usage=0.75 GB",
    "[2026-02-27 11:50:33 TP0] Load weight begin. avail mem=139.20 GB",
    "[2026-02-27 11:50:33 TP1] Load weight begin. avail mem=139.20 GB",
    "{t}",
    "[2026-02-27 11:52:10 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, "
    "avail mem=70.75 GB, mem usage=68.45 GB.",
    "[2026-02-27 11:52:11 TP0] KV Cache is allocated. #tokens: 403264, K size: 12.31 GB, V size: 12.31 GB",
    "[2026-02-27 11:52:12 TP0] Capture cuda graph begin. This can take up to several minutes. "
    "avail mem=44.10 GB",
    "{t}",
    "[2026-02-27 11:53:40 TP0] Capture cuda graph end. Time elapsed: 88.12 s. mem usage=2.31 GB. "
    "avail mem=41.79 GB.",
    "[2026-02-27 11:53:41 TP0] max_total_num_tokens=403264, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=48, context_len=8192, available_gpu_mem=41.79 GB",
    "{t}",
    "[2026-02-27 11:53:45] The server is fired up and ready to roll!",
]

# SGLang 0.5.17's start-up on a real H200 (device kit, "Real failure lines"; EAGLE adds the draft and
# verify graphs, 0.5.15+ the prefill graph: model_executor/model_runner_components/cuda_graph_setup.py).
STARTUP_0517 = [
    "[2026-12-01 10:00:01] server_args=ServerArgs(model_path='/models/m', tp_size=1, "
    "mem_fraction_static=0.893)",
    "[2026-12-01 10:00:05 TP0] Load weight begin. avail mem=139.20 GB",
    "[2026-12-01 10:00:09 TP0] Load weight end. elapsed=4.12 s, type=LlamaForCausalLM, avail mem=136.90 GB, "
    "mem usage=2.30 GB.",
    "[2026-12-01 10:00:10 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 3806725, "
    "K size: 58.09 GB, V size: 58.09 GB",
    "[2026-12-01 10:00:10 TP0] Memory pool end. avail mem=20.71 GB",
    "[2026-12-01 10:00:11 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
    "num_tokens=[4, 8], avail mem=20.60 GB",
    "[2026-12-01 10:00:12 TP0] Capture target prefill CUDA graph end. elapsed=1.02 s, mem usage=0.05 GB, "
    "avail mem=20.55 GB.",
    "[2026-12-01 10:00:12 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "bs=[1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64], avail mem=20.44 GB",
    "{t}",
    "[2026-12-01 10:01:25 TP0] Capture target decode CUDA graph end. elapsed=72.68 s, mem usage=0.08 GB, "
    "avail mem=20.35 GB.",
    "[2026-12-01 10:01:26 TP0] max_total_num_tokens=3806725, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=4096, context_len=8192, available_gpu_mem=20.35 GB",
    "[2026-12-01 10:01:30] The server is fired up and ready to roll!",
]

OOM_TRACEBACK = [
    "[2026-02-27 11:52:12 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sglang/srt/model_executor/model_runner.py", line 1700, in init_memory_pool',
    "    raise RuntimeError(",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: self.server_args.mem_fraction_static=0.55",
]


def _script(lines: list[str], delay_s: float, then: str) -> list[str]:
    """A python -c that prints `lines` to stderr (as SGLang logs), sleeping `delay_s` at each {t}."""
    code = textwrap.dedent(
        f"""
        import sys, time
        for line in {lines!r}:
            if line == "{{t}}":
                time.sleep({delay_s})
            else:
                print(line, file=sys.stderr, flush=True)
        """
    )
    return [sys.executable, "-c", code + then]


def _start(procs: list[ServerProcess], tmp_path: Path, argv: list[str]) -> ServerProcess:
    log = tmp_path / "server.log"
    log.write_text(
        "old trial: RuntimeError: Not enough memory. Please try to increase --mem-fraction-static\n"
    )
    proc = LocalCommandRunner().start(argv, {}, log)
    procs.append(proc)
    return proc


@pytest.mark.integration
def test_ready_line_with_phase_timings(tmp_path: Path, started: list[ServerProcess]) -> None:
    proc = _start(started, tmp_path, _script(STARTUP, 0.2, "time.sleep(30)"))
    phases: list[str] = []
    out = wait_until_ready(
        proc, proc.log_path, lambda: False, timeout_s=20, poll_s=0.05, on_phase=phases.append
    )
    assert out.status is StartupStatus.READY, out
    assert out.ready and out.ready_via == "log" and out.failure is None
    assert phases == ["loading", "capturing", "ready"]
    names = [
        "load_weight_begin",
        "load_weight_end",
        "capture_cuda_graph_begin",
        "capture_cuda_graph_end",
        "ready",
    ]
    assert list(out.phase_times) == names
    times = [out.phase_times[n] for n in names]
    assert times == sorted(times)
    assert out.phase_times["load_weight_end"] - out.phase_times["load_weight_begin"] >= 0.15
    assert proc.poll() is None  # ready and still serving


@pytest.mark.integration
def test_ready_check_alone_suffices(tmp_path: Path, started: list[ServerProcess]) -> None:
    flag = tmp_path / "healthy"
    proc = _start(
        started,
        tmp_path,
        _script(
            STARTUP[:5],
            0,
            f"import pathlib, time; time.sleep(0.3); pathlib.Path({str(flag)!r}).touch(); time.sleep(30)",
        ),
    )

    def health() -> bool:
        if not flag.exists():
            raise ConnectionRefusedError  # what an HTTP check raises before the port opens
        return True

    out = wait_until_ready(proc, proc.log_path, health, timeout_s=20, poll_s=0.05)
    assert out.status is StartupStatus.READY and out.ready_via == "check"
    assert "load_weight_begin" in out.phase_times and "ready" not in out.phase_times


@pytest.mark.integration
def test_fatal_line_fails_fast_while_process_lingers(tmp_path: Path, started: list[ServerProcess]) -> None:
    # SGLang's parent can take a while to notice and kill its tree: FAILED must not wait for the exit.
    proc = _start(started, tmp_path, _script([*STARTUP[:5], "{t}", *OOM_TRACEBACK], 0.3, "time.sleep(30)"))
    t0 = time.monotonic()
    out = wait_until_ready(proc, proc.log_path, lambda: False, timeout_s=20, poll_s=0.2)
    took = time.monotonic() - t0
    assert out.status is StartupStatus.FAILED
    assert out.failure is not None and out.failure.kind is FailureKind.KV_POOL_TOO_SMALL
    assert out.failure.line.startswith("RuntimeError: Not enough memory.")
    assert out.returncode is None and proc.poll() is None
    # Fatal line printed ~0.3 s after start (plus interpreter start-up); FAILED within 2 s of it.
    assert took < 0.3 + 2.0 + 0.5


@pytest.mark.integration
def test_exit_after_fatal_line_classifies_root_cause(tmp_path: Path, started: list[ServerProcess]) -> None:
    lines = [
        *STARTUP[:9],
        "[2026-02-27 11:52:20 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
        "[2026-02-27 11:52:21] Received sigquit from a child process. It usually means the child failed.",
    ]
    proc = _start(
        started, tmp_path, _script(lines, 0, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    )
    phases: list[str] = []
    out = wait_until_ready(proc, proc.log_path, None, timeout_s=20, poll_s=0.05, on_phase=phases.append)
    assert out.status is StartupStatus.FAILED
    assert out.failure is not None and out.failure.kind is FailureKind.CUDA_GRAPH_OOM
    assert out.returncode == -9
    assert phases == ["loading", "capturing"]


@pytest.mark.integration
def test_exit_without_pattern_is_unknown_crash_with_status(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    # The last line has no newline: it must still be read once the process is gone.
    then = "sys.stderr.write('KeyError: model_type'); sys.stderr.flush(); sys.exit(3)"
    proc = _start(started, tmp_path, _script(STARTUP[:4], 0, then))
    out = wait_until_ready(proc, proc.log_path, lambda: False, timeout_s=20, poll_s=0.05)
    assert out.status is StartupStatus.FAILED
    assert out.failure is not None and out.failure.kind is FailureKind.UNKNOWN_CRASH
    assert out.returncode == 3
    assert "status 3" in out.failure.description
    assert out.failure.line == "KeyError: model_type"


@pytest.mark.integration
def test_propagation_marker_alone_fails_as_unknown_crash(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    lines = [
        *STARTUP[:4],
        "[2026-02-27 11:50:34] Rank 0 scheduler is dead. Please check if there are relevant logs.",
    ]
    proc = _start(started, tmp_path, _script(lines, 0, "time.sleep(30)"))
    out = wait_until_ready(proc, proc.log_path, lambda: False, timeout_s=20, poll_s=0.05)
    assert out.status is StartupStatus.FAILED
    assert out.failure is not None and out.failure.kind is FailureKind.UNKNOWN_CRASH
    assert "Rank 0 scheduler is dead" in out.failure.line


@pytest.mark.integration
def test_0517_phase_markers_and_memory_report(tmp_path: Path, started: list[ServerProcess]) -> None:
    proc = _start(started, tmp_path, _script(STARTUP_0517, 0.1, "time.sleep(30)"))
    phases: list[str] = []
    out = wait_until_ready(
        proc, proc.log_path, lambda: False, timeout_s=20, poll_s=0.05, on_phase=phases.append
    )
    assert out.status is StartupStatus.READY, out
    assert phases == ["loading", "capturing", "ready"]
    assert list(out.phase_times) == [
        "load_weight_begin",
        "load_weight_end",
        "capture_cuda_graph_begin",
        "capture_cuda_graph_end",
        "ready",
    ]
    assert out.server_memory == {
        "weights_gb": 2.30,
        "kv_cache_tokens": 3806725.0,
        "kv_cache_gb": 116.18,
        "max_total_num_tokens": 3806725.0,
        "max_running_requests": 4096.0,
        "context_len": 8192.0,
        "available_gpu_mem_gb": 20.35,
    }


@pytest.mark.integration
def test_a_hang_in_the_second_graphs_capture_names_that_capture(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    # The prefill graph was captured; the decode graph's capture never ends.
    lines = STARTUP_0517[: STARTUP_0517.index("{t}")]
    proc = _start(started, tmp_path, _script(lines, 0, "time.sleep(30)"))
    out = wait_until_ready(proc, proc.log_path, lambda: False, timeout_s=0.8, poll_s=0.05)
    assert out.status is StartupStatus.TIMEOUT and out.failure is not None
    assert "last phase seen: capture_cuda_graph_begin" in out.failure.description


@pytest.mark.parametrize(
    "line",
    [  # <= 0.5.13, then 0.5.15+ (0.5.17, 0.5.23: verify with speculation)
        "Capture cuda graph begin. This can take up to several minutes. avail mem=44.10 GB",
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1], avail mem=20 GB",
        "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, avail mem=20 GB",
        "Capture draft decode CUDA graph begin. backend=full, avail mem=20.44 GB",
        "Capture target prefill CUDA graph begin. backend=tc_piecewise, num_tokens=[4, 8], avail mem=3.1 GB",
    ],
)
def test_every_capture_marker_starts_the_capturing_phase(line: str) -> None:
    from autotune.node.logwatch import _MARKERS

    names = [name for regex, name in _MARKERS if regex.search("[2026-12-01 10:00:12 TP0] " + line)]
    assert names == ["capture_cuda_graph_begin"]
    assert not any(regex.search("Exception: Capture cuda graph failed: x") for regex, _ in _MARKERS)


def test_the_weights_one_gpu_holds_are_read_from_the_real_load_line() -> None:
    from autotune.node.logwatch import server_memory

    # Real 0.5.17 on an H200 (tests/data/sglang-0.5.17-h200/start-ready.log), and 0.5.13's older wording.
    real = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200" / "start-ready.log"
    line = real.read_text().splitlines()[13]
    assert server_memory(line) == {"weights_gb": 13.51}
    old = "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=6.1 GB, mem usage=14.99 GB"
    assert server_memory(old) == {"weights_gb": 14.99}
    assert server_memory("Load weight begin. avail mem=139.20 GB") == {}


def test_the_memory_report_of_an_mla_model() -> None:
    from autotune.node.logwatch import server_memory

    line = "[TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 403264, KV size: 24.62 GB"
    assert server_memory(line) == {"kv_cache_tokens": 403264.0, "kv_cache_gb": 24.62}
    assert server_memory("KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 9") == {}


@pytest.mark.integration
def test_hang_times_out(tmp_path: Path, started: list[ServerProcess]) -> None:
    proc = _start(started, tmp_path, _script(STARTUP[:5], 0, "time.sleep(30)"))
    t0 = time.monotonic()
    out = wait_until_ready(proc, proc.log_path, lambda: False, timeout_s=0.8, poll_s=0.05)
    assert 0.8 <= time.monotonic() - t0 < 2.0
    assert out.status is StartupStatus.TIMEOUT
    assert out.failure is not None and out.failure.kind is FailureKind.STARTUP_TIMEOUT
    assert "load_weight_begin" in out.failure.description
    assert proc.poll() is None


def test_log_follower_is_incremental(tmp_path: Path) -> None:
    log = tmp_path / "log"
    follower = LogFollower(log)
    assert follower.poll_new_lines() == []  # no file yet
    with open(log, "ab") as f:
        f.write(b"one\ntw")
        f.flush()
        assert follower.poll_new_lines() == ["one"]
        f.write(b"o\r\nthree \xc3")  # a UTF-8 character split across writes
        f.flush()
        assert follower.poll_new_lines() == ["two"]
        offset = follower.offset
        f.write(b"\xa9\n")
        f.flush()
        assert follower.poll_new_lines() == ["three é"]
        assert follower.offset == offset + 2  # only the new bytes were read
        f.write(b"tail")
        f.flush()
    assert follower.poll_new_lines() == []
    assert follower.flush() == ["tail"]
    log.write_bytes(b"new\n")  # truncated and rewritten: start over
    assert follower.poll_new_lines() == ["new"]


def test_log_follower_starts_at_offset(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"old\nnew\n")
    assert LogFollower(log, offset=4).poll_new_lines() == ["new"]


def test_the_servers_own_choices_are_read_from_its_server_args_line() -> None:
    line = (
        "[2026-02-27 11:50:30] server_args=ServerArgs(model_path='/models/Kimi-K2.5', tp_size=8, "
        "mem_fraction_static=0.847, max_running_requests=None, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, cuda_graph_max_bs=256, cuda_graph_bs=None, enable_nccl_nvls=False)"
    )
    assert server_choices(line) == {
        "--mem-fraction-static": 0.847,
        "--chunked-prefill-size": 8192.0,
        "--cuda-graph-max-bs-decode": 256.0,  # under the newest spelling of the knob
    }
    assert server_choices(line.replace("server_args=ServerArgs(", "args(")) == {}
    assert server_choices(STARTUP[0]) == {}  # a line without the fields


SERVER_ARGS_LINES = Path(__file__).parents[1] / "data" / "server_args"


@pytest.mark.parametrize(
    ("version", "prefill"),
    [
        ("0.5.11", None),
        ("0.5.17", None),
        ("0.5.19", None),
        ("0.5.23", None),
        ("0.5.17-prefill", 48.0),
        ("0.5.23-prefill", 48.0),
    ],
)
def test_the_servers_own_choices_are_read_from_every_format_sglang_logs(
    version: str, prefill: float | None
) -> None:
    # Lines built from each version's real ServerArgs fields (data/server_args/generate.py): a repr up to
    # 0.5.17 (0.5.17's with cuda_graph_max_bs_decode=None and the batch in cuda_graph_config), a dict after.
    line = "[2026-12-01 10:00:00] " + (SERVER_ARGS_LINES / f"{version}.log").read_text().strip()
    expected = {
        "--mem-fraction-static": 0.893,
        "--chunked-prefill-size": 8192.0,
        "--cuda-graph-max-bs-decode": 160.0 if prefill else 512.0,
    }
    if prefill is not None:
        expected["--cuda-graph-max-bs-prefill"] = prefill
    assert server_choices(line) == expected


def test_a_flat_graph_batch_is_read_when_the_phase_has_none() -> None:
    line = (
        "server_args={'mem_fraction_static': 0.9, 'cuda_graph_config': {'decode': {'backend': 'full', "
        "'max_bs': None, 'bs': None}, 'prefill': {'backend': 'disabled', 'max_bs': None}}, "
        "'cuda_graph_max_bs_decode': 64, 'cuda_graph_max_bs_prefill': None, 'chunked_prefill_size': -1}"
    )
    assert server_choices(line) == {
        "--mem-fraction-static": 0.9,
        "--chunked-prefill-size": -1.0,
        "--cuda-graph-max-bs-decode": 64.0,
    }


@pytest.mark.integration
def test_startup_outcome_carries_the_servers_choices(tmp_path: Path, started: list[ServerProcess]) -> None:
    first = STARTUP[0].replace("tp_size=2", "tp_size=2, mem_fraction_static=0.88, cuda_graph_max_bs=160")
    proc = _start(started, tmp_path, _script([first, *STARTUP[1:]], 0, "time.sleep(30)"))
    out = wait_until_ready(proc, proc.log_path, None, timeout_s=20, poll_s=0.05)
    assert out.status is StartupStatus.READY
    assert out.server_choices == {"--mem-fraction-static": 0.88, "--cuda-graph-max-bs-decode": 160.0}
