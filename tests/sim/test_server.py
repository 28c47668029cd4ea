"""The simulated SGLang node as a real process: its log, its HTTP API, its fatal exits and its faults."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from autotune.trial.failures import FailureKind, classify
from tests.builders import REPO

pytestmark = pytest.mark.integration

MODEL_PATH = "moonshotai/Kimi-K2.5"
TIME_SCALE = "0.001"  # the ten-minute weight load takes 0.6 s
DATE = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
# SGLang 0.5.17 srt/mem_cache/kv_cache_configurator.py:1646-1655 (device-kit README "Real failure lines").
NOT_ENOUGH_MEMORY = re.compile(
    r"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0\.55\. "
    r"Raise --mem-fraction-static above 0\.\d{3} \(minimum viable = 1 - available/pre = 0\.\d{4}\)\. "
    r"If using speculative decoding, draft weights are now counted\.$"
)
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
READY_LINE = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SimServer:
    """One `python -m autotune.sim.sglang_server` process, its merged output collected line by line."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None, tp: int = 8) -> None:
        self.port = free_port()
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
        command = [sys.executable, "-m", "autotune.sim.sglang_server", "--model-path", MODEL_PATH]
        command += ["--port", str(self.port), *(["--tp", str(tp)] if tp > 1 else []), *flags]
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            env={**base_env, "SGLANG_SIM_TIME_SCALE": TIME_SCALE, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 20.0) -> str:
        """The first line containing `needle`; fails with the log if it does not come in time."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{needle!r} never appeared; log:\n{self.log}")
                self._changed.wait(min(left, 0.1))

    def wait_exit(self, timeout: float = 20.0) -> int:
        returncode = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return returncode

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path: str, payload: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url(path), data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stream(self, path: str, payload: dict[str, Any]) -> list[str]:
        """The `data: ...` payloads of a server-sent event stream, until it ends or breaks."""
        request = urllib.request.Request(
            self.url(path), data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        events: list[str] = []
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.headers["Content-Type"].startswith("text/event-stream")
                buffer = b""
                for raw in response:
                    buffer += raw
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        assert event.startswith(b"data: "), event
                        events.append(event[len(b"data: ") :].decode())
        except (http.client.IncompleteRead, ConnectionError, urllib.error.URLError):
            pass  # the server died mid-stream: the caller checks what arrived
        return events

    def wait_ready(self, timeout: float = 20.0) -> None:
        self.wait_for(READY_LINE, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.wait_exit()


def ready_sim_server(*flags: str, env: dict[str, str] | None = None) -> Iterator[SimServer]:
    """A simulated server started with `flags` and `env`, ready; closed after (a fixture's body)."""
    server = SimServer(*flags, env=env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def poll_health_until_ready(server: SimServer, timeout: float = 20.0) -> list[int | None]:
    """The distinct /health answers from launch to the first 200, None while nothing listens."""
    statuses: list[int | None] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = server.get("/health", timeout=5)
        except (urllib.error.URLError, ConnectionError):
            status = None  # not listening yet: SGLang binds only once the schedulers are up
        if not statuses or statuses[-1] != status:
            statuses.append(status)
        if status == 200:
            break
        time.sleep(0.02)
    return statuses


@pytest.fixture
def launch() -> Iterator[Callable[..., SimServer]]:
    """Start servers for one test; whatever the test's outcome, none outlives it."""
    servers: list[SimServer] = []

    def start(*flags: str, env: dict[str, str] | None = None, tp: int = 8) -> SimServer:
        servers.append(SimServer(*flags, env=env, tp=tp))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[SimServer, list[int | None]]]:
    """The seed's launch (Kimi-K2.5 on 8 PCIe GPUs, TP 8), with /health polled from the first moment."""
    server = SimServer()
    try:
        yield server, poll_health_until_ready(server)
    finally:
        server.close()


@pytest.fixture(scope="module")
def speculative() -> Iterator[SimServer]:
    yield from ready_sim_server(
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "lmsys/Kimi-K2.5-EAGLE3",
        "--skip-server-warmup",
    )  # fmt: skip


# -- startup --------------------------------------------------------------------------------------------
def test_startup_log_is_sglangs_in_order(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    server.wait_ready()
    expected = [
        rf"^{DATE}\] server_args=ServerArgs\(model_path='{MODEL_PATH}', .*tp_size=8, ",
        rf"^{DATE} TP0\] Init torch distributed begin\.$",
        rf"^{DATE} TP0\] Custom allreduce is disabled because it's not supported on more than two PCIe",
        rf"^{DATE} TP0\] Init torch distributed ends\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB$",
        rf"^{DATE} TP0\] Load weight begin\. avail mem=\d+\.\d\d GB$",
        # SGLang 0.5.17's default multithreaded loader (weight_utils.py: buffered_multi_thread_...iterator).
        r"^Multi-thread loading shards:   0% Completed \| 0/64 \[00:00<\?, \?it/s\]$",
        r"^Multi-thread loading shards:  19% Completed \| 12/64 \[00:2\d<0\d:\d\d,  \d\.\d\ds/it",
        r"^Multi-thread loading shards: 100% Completed \| 64/64 \[",
        # SGLang 0.5.17: model_runner.py:1099-1106, memory_pool.py:1669-1681 (MLA: one KV size),
        # kv_cache_configurator.py:257-260, cuda_graph_setup.py:362-366 (prefill, first) and :429-456.
        rf"^{DATE} TP0\] Load weight end\. elapsed=\d+\.\d\d s, type=\w+, quant=compressed-tensors, "
        r"avail mem=\d+\.\d\d GB, mem usage=68\.38 GB\.$",
        rf"^{DATE} TP0\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, "
        r"KV size: \d+\.\d\d GB$",
        rf"^{DATE} TP0\] Memory pool end\. avail mem=\d+\.\d\d GB$",
        rf"^{DATE} TP0\] Capture target prefill CUDA graph begin\. backend=tc_piecewise, num_tokens=\[4, 8, ",
        rf"^{DATE} TP0\] Capture target prefill CUDA graph end\. elapsed=",
        rf"^{DATE} TP0\] Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, "
        r"bs=\[1, 2, 4, 8, 12, 16, 24, .*, 512\], avail mem=\d+\.\d\d GB$",
        rf"^{DATE} TP0\] Capture target decode CUDA graph end\. elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB, "
        r"avail mem=\d+\.\d\d GB\.$",
        rf"^{DATE} TP0\] max_total_num_tokens=\d+, chunked_prefill_size=8192, max_prefill_tokens=\d+, "
        r"max_running_requests=\d+, context_len=\d+, available_gpu_mem=\d+\.\d\d GB$",
        rf"^{DATE}\] INFO:     Uvicorn running on http://127\.0\.0\.1:{server.port} ",
        rf'^{DATE}\] INFO:     127\.0\.0\.1:\d+ - "GET /get_model_info HTTP/1\.1" 200 OK$',
        rf'^{DATE}\] INFO:     127\.0\.0\.1:\d+ - "POST /generate HTTP/1\.1" 200 OK$',
        rf"^{DATE}\] {READY_LINE}$",
    ]
    position = 0
    for pattern in expected:
        while position < len(server.lines) and not re.search(pattern, server.lines[position]):
            position += 1
        assert position < len(server.lines), f"{pattern!r} missing or out of order; log:\n{server.log}"
        position += 1


def test_every_rank_logs_its_per_rank_lines(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    server.wait_ready()
    for message in ("Init torch distributed ends", "Load weight end", "KV Cache is allocated"):
        ranks = [m.group(1) for line in server.lines if (m := re.search(r" TP(\d)\] " + message, line))]
        assert ranks == [str(r) for r in range(8)], message
    assert not any(re.search(r" TP[1-7]\] (Prefill|Decode) batch", line) for line in server.lines)


def test_health_is_503_during_warmup_then_200(served: tuple[SimServer, list[int | None]]) -> None:
    _, statuses = served
    assert statuses[-1] == 200
    assert 503 in statuses, statuses
    assert statuses.index(503) < statuses.index(200)
    assert set(statuses) <= {None, 503, 200}


# -- HTTP API -------------------------------------------------------------------------------------------
def test_generate_streams_sglangs_sse_chunks(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    payload = {"text": "one two three four", "sampling_params": {"max_new_tokens": 6}, "stream": True}
    events = server.stream("/generate", payload)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    # B13: non-incremental streaming (the default) sends the cumulative ids (tokenizer_manager.py:2341-2354).
    assert len(chunks[-1]["output_ids"]) == 6 and len(chunks) > 1
    for previous, chunk in itertools.pairwise(chunks):
        assert chunk["output_ids"][: len(previous["output_ids"])] == previous["output_ids"]
    for chunk in chunks:
        assert set(chunk) == {"text", "output_ids", "meta_info"}
        assert chunk["meta_info"]["prompt_tokens"] == 4
    for previous, chunk in itertools.pairwise(chunks):
        assert chunk["text"].startswith(previous["text"]) and len(chunk["text"]) > len(previous["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 6}
    assert last["completion_tokens"] == 6 and last["e2e_latency"] > 0
    assert "e2e_latency" not in chunks[0]["meta_info"] and "spec_accept_length" not in last


def test_generate_counts_input_ids(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    payload = {"input_ids": list(range(50)), "sampling_params": {"max_new_tokens": 3}, "stream": True}
    events = server.stream("/generate", payload)
    assert json.loads(events[0])["meta_info"]["prompt_tokens"] == 50


def test_generate_non_streaming(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    status, body = server.post(
        "/generate",
        {
            "input_ids": [1, 2, 3],
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
        },
    )
    assert status == 200
    assert len(body["output_ids"]) == 5 and len(body["text"].split()) == 5
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 5
    assert meta["finish_reason"] == {"type": "length", "length": 5} and meta["e2e_latency"] > 0


def test_generate_rejects_what_sglang_rejects(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    status, body = server.post("/generate", {"sampling_params": {"max_new_tokens": 1}})
    assert status == 400 and body["error"]["message"] == "Either text or input_ids should be provided."
    status, body = server.post("/generate", {"input_ids": [1] * 262144})
    assert (
        status == 400 and "longer than the model's context length (262144 tokens)" in body["error"]["message"]
    )


def test_model_and_server_info(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    for path in ("/get_model_info", "/model_info"):
        status, body = server.get(path)
        info = json.loads(body)
        assert status == 200 and info["model_path"] == MODEL_PATH and info["is_generation"] is True
        assert info["tokenizer_path"] == MODEL_PATH
    for path in ("/get_server_info", "/server_info"):
        status, body = server.get(path)
        info = json.loads(body)
        assert status == 200 and info["version"] == "0.5.17" and info["time_scale"] == 0.001
        assert info["tp_size"] == 8 and info["model_path"] == MODEL_PATH and info["port"] == server.port
        assert info["max_total_num_tokens"] > 0 and 0 < info["mem_fraction_static"] < 1
        # 0.5.17 has no cuda_graph_max_bs key any more (device-kit README): the decode graph's sits here.
        assert "cuda_graph_max_bs" not in info and info["cuda_graph_config"]["decode"]["max_bs"] == 512
        assert info["chunked_prefill_size"] == 8192
        state = info["internal_states"][0]
        assert "last_gen_throughput" in state and "avg_spec_accept_length" not in state
    # The old name answers with a warning per call (http_server.py:771-778); /server_info does not warn.
    warned = "Endpoint '/get_server_info' is deprecated and will be removed in a future version."
    assert sum(warned in line for line in server.lines) >= 1
    request = urllib.request.Request(server.url("/flush_cache"), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.read().startswith(b"Cache flushed.")


def test_openai_models_and_completions(served: tuple[SimServer, list[int | None]]) -> None:
    server, _ = served
    status, body = server.get("/v1/models")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list" and models["data"][0]["id"] == MODEL_PATH

    status, completion = server.post(
        "/v1/completions", {"model": MODEL_PATH, "prompt": "a b c", "max_tokens": 4}
    )
    assert status == 200 and completion["object"] == "text_completion"
    assert completion["choices"][0]["finish_reason"] == "length"
    assert len(completion["choices"][0]["text"].split()) == 4
    assert completion["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": None,
    }

    payload = {"prompt": "a b c", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    events = server.stream("/v1/completions", payload)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).count(" ") == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 3

    status, chat = server.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}
    )
    assert status == 200 and chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["completion_tokens"] == 2


def test_speculation_reports_accept_length(speculative: SimServer) -> None:
    events = speculative.stream(
        "/generate", {"input_ids": [7] * 100, "sampling_params": {"max_new_tokens": 120}, "stream": True}
    )
    meta = json.loads(events[-2])["meta_info"]
    assert meta["completion_tokens"] == 120 and meta["spec_verify_ct"] > 0
    # completion_tokens / verify_ct, the prefill's token included (tokenizer_manager.py:2767-2769).
    assert meta["spec_accept_length"] == pytest.approx(120 / meta["spec_verify_ct"])
    assert 1.5 < meta["spec_accept_length"] < 4.0
    info = json.loads(speculative.get("/get_server_info")[1])
    assert info["speculative_algorithm"] == "EAGLE3" and info["max_running_requests"] == 48
    assert info["disable_overlap_schedule"] is False  # spec v2 keeps overlap (B1)
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (3, 1)
    assert 1.5 < info["internal_states"][0]["avg_spec_accept_length"] < 4.0
    decode = speculative.wait_for("Decode batch [40]")
    assert re.search(
        r" TP0\] Decode batch \[40\], #running-req: 1, #token: \d+, token usage: \d\.\d\d, ", decode
    )
    assert re.search(r"accept len: \d\.\d\d, accept rate: \d\.\d\d, cuda graph: True, ", decode)
    assert any(line.startswith("Max running requests is reset to 48") for line in speculative.lines)


# -- fatal exits ----------------------------------------------------------------------------------------
def test_unknown_flag_exits_2_with_argparses_message(launch: Callable[..., SimServer]) -> None:
    server = launch("--no-such-flag", "1")
    assert server.wait_exit() == 2
    assert "sglang serve: error: unrecognized arguments: --no-such-flag 1" in server.log
    assert server.log.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")


def test_0_5_23_exits_2_on_the_removed_graph_flag(launch: Callable[..., SimServer]) -> None:
    server = launch("--cuda-graph-max-bs", "128", env={"SGLANG_SIM_VERSION": "0.5.23"})
    assert server.wait_exit() == 2
    # What SGLang 0.5.23's parser printed for this flag (shared/reference/sglang-versions.md A1).
    assert server.lines[-1] == (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill"
    )


def test_unknown_version_exits_1_naming_the_variable(launch: Callable[..., SimServer]) -> None:
    server = launch(env={"SGLANG_SIM_VERSION": "0.5.4"})
    assert server.wait_exit() == 1
    assert "SGLANG_SIM_VERSION" in server.log and "'0.5.4'" in server.log and "0.5.17, 0.5.23" in server.log


def test_speculative_value_error_exits_1_before_launching(launch: Callable[..., SimServer]) -> None:
    server = launch(
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
        "--speculative-num-draft-tokens", "8", "--page-size", "16", "--attention-backend", "flashmla",
    )  # fmt: skip
    assert server.wait_exit() == 1
    # The kimi profile resolves triton on SM120, which the tree draft supports (B5); flashmla does not.
    assert server.lines[-1].startswith(
        "ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
        "('flashinfer', 'fa3', 'triton'); got attention_backend='flashmla'."
    )
    assert "server_args=" not in server.log


def test_not_enough_memory_at_055_dies_after_weight_loading(launch: Callable[..., SimServer]) -> None:
    server = launch("--mem-fraction-static", "0.55", "--cuda-graph-max-bs", "128")
    assert server.wait_exit() == -signal.SIGKILL
    lines = server.lines
    begin = next(i for i, line in enumerate(lines) if "Load weight begin" in line)
    failure = next(i for i, line in enumerate(lines) if NOT_ENOUGH_MEMORY.fullmatch(line))
    assert begin < failure < lines.index(next(line for line in lines if line.endswith(SIGQUIT_LINE)))
    assert any(re.match(rf"{DATE} TP\d\] Scheduler hit an exception: Traceback", line) for line in lines)
    assert re.match(rf"{DATE}\] {SIGQUIT_LINE}$", lines[-1])
    assert READY_LINE not in server.log and "Uvicorn running" not in server.log


def test_flashinfer_allreduce_fusion_fails_deterministically_on_sm120(
    launch: Callable[..., SimServer],
) -> None:
    server = launch("--enable-flashinfer-allreduce-fusion")
    assert server.wait_exit() == -signal.SIGKILL
    # SGLang 0.5.17 layers/flashinfer_comm_fusion.py:46-50, at runner warm-up after the KV pool.
    assert "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in server.log
    assert server.log.index("Memory pool end") < server.log.index("FlashInfer allreduce fusion requires")
    assert "CUDA graph begin" not in server.log
    assert server.lines[-1].endswith(SIGQUIT_LINE)


def test_oom_under_load_kills_the_server(launch: Callable[..., SimServer]) -> None:
    # One unchunked 40k-token prefill needs more activation memory than the graphs left free.
    server = launch(
        "--chunked-prefill-size", "65536", "--mem-fraction-static", "0.85", "--skip-server-warmup"
    )
    server.wait_ready()
    events = server.stream("/generate", {"input_ids": [5] * 40000, "sampling_params": {"max_new_tokens": 8}})
    assert "[DONE]" not in events
    assert server.wait_exit() == -signal.SIGKILL
    assert "torch.OutOfMemoryError: CUDA out of memory." in server.log
    assert server.lines[-1].endswith(SIGQUIT_LINE)


# -- faults and shutdown --------------------------------------------------------------------------------
def test_hang_load_never_becomes_ready_and_sigterm_exits_0(launch: Callable[..., SimServer]) -> None:
    server = launch(env={"SGLANG_SIM_FAULT": "hang_load"})
    server.wait_for("Multi-thread loading shards:  17% Completed | 11/64")
    time.sleep(1.0)  # longer than the whole load would take at this time scale
    assert "Load weight end" not in server.log and READY_LINE not in server.log
    assert "12/64" not in server.log
    with pytest.raises(urllib.error.URLError):
        server.get("/health", timeout=2)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(timeout=5) == 0
    assert time.monotonic() - started < 3


def test_stream_interval_and_sigterm_on_another_node(launch: Callable[..., SimServer]) -> None:
    other_node = {"SGLANG_SIM_MODEL": "llama-70b-bf16", "SGLANG_SIM_HARDWARE": "h200-nvlink-x8"}
    server = launch("--skip-server-warmup", "--stream-interval", "4", tp=4, env=other_node)
    server.wait_ready()
    assert server.get("/health")[0] == 200
    events = server.stream(
        "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10}, "stream": True}
    )
    totals = [len(json.loads(e)["output_ids"]) for e in events[:-1]]  # cumulative (B13)
    sizes = [b - a for a, b in itertools.pairwise([0, *totals])]
    # The first token goes out at once (time to first token), then at least every 4th, then the rest.
    assert sum(sizes) == 10 and sizes[0] == 1 and all(size >= 4 for size in sizes[1:-1]), sizes
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(timeout=5) == 0
    assert time.monotonic() - started < 3
    assert "Finished server process" in server.lines[-1]


def test_crash_benchmark_dies_mid_stream_and_slow_health_is_slow(launch: Callable[..., SimServer]) -> None:
    server = launch("--skip-server-warmup", env={"SGLANG_SIM_FAULT": "slow_health,crash_benchmark:50"})
    server.wait_ready()
    started = time.monotonic()
    assert server.get("/health")[0] == 200
    assert time.monotonic() - started >= 2.0
    events = server.stream(
        "/generate", {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 500}, "stream": True}
    )
    assert "[DONE]" not in events
    delivered = len(json.loads(events[-1])["output_ids"]) if events else 0
    assert delivered < 500
    assert server.wait_exit() == 1
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in server.log


def test_0517_drops_its_prefill_graphs_with_too_little_memory_as_the_real_server_logs_it(
    launch: Callable[..., SimServer],
) -> None:
    # Real H200, 0.5.17, --mem-fraction-static 0.99 (tests/data/sglang-0.5.17-h200/): the warning, then the
    # decode graphs, and a start.
    real_log = REPO / "tests" / "data" / "sglang-0.5.17-h200" / "oom-under-load-prefill-graphs-dropped.log"
    real = next(line for line in real_log.read_text().splitlines() if "Disabling auto-selected" in line)
    h200 = {"SGLANG_SIM_MODEL": "llama-8b-dummy", "SGLANG_SIM_HARDWARE": "h200-x1"}

    def shape(line: str) -> str:  # the text without the time and the figures
        return re.sub(r"\d+\.\d\d", "N", line.split("] ", 1)[1])

    server = launch("--skip-server-warmup", "--mem-fraction-static", "0.99", tp=1, env=h200)
    assert shape(server.wait_for("Disabling auto-selected prefill CUDA graph")) == shape(real)
    server.wait_ready()
    assert not any("Capture target prefill" in line for line in server.lines)
    # Set by hand, the backend skips the gate (0.5.17), and 0.5.23 has none: both try, and fail. 0.5.17's
    # breakable backend writes the real server's hint after torch's error, word for word.
    real = (REPO / "tests" / "data" / "sglang-0.5.17-h200" / "prefill-capture-oom-breakable.log").read_text()

    def hint(log: str) -> list[str]:
        lines = log.splitlines()
        start = next(i for i, line in enumerate(lines) if "OutOfMemoryError: CUDA out of memory" in line)
        end = next(i for i, line in enumerate(lines) if line.startswith("Open an issue on GitHub"))
        return [shape(lines[start]).split(" Tried")[0], *lines[start + 1 : end + 1]]

    for flags, env in (
        (("--cuda-graph-backend-prefill", "breakable"), h200),
        ((), {**h200, "SGLANG_SIM_VERSION": "0.5.23"}),
    ):
        failing = launch("--mem-fraction-static", "0.99", *flags, tp=1, env=env)
        failing.wait_for("Capture target prefill CUDA graph begin")
        failing.wait_for("torch.OutOfMemoryError: CUDA out of memory")
        assert not any("Disabling auto-selected" in line for line in failing.lines)
        failure = classify(failing.log, "starting")
        assert failure is not None and failure.kind is FailureKind.PREFILL_GRAPH_OOM, failing.log
        assert (hint(failing.log) == hint(real)) is (env is h200)
