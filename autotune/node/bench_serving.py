"""SGLang's own benchmark client as a trial's measurement: `python -m sglang.bench_serving` on the node.

It runs through the trial's command runner (so on the node itself, locally or over SSH) with the
`random-ids` dataset, `--random-range-ratio 1.0` (bench_serving's default 0.0 draws lengths from [1, L]) and
a local tokenizer, with the Hugging Face libraries offline, so nothing is downloaded. Its result is the one
JSON line it appends to `--output-file`, which `parse_output` turns into a `BenchmarkResult` in server time
(see `autotune.measure.client.BenchmarkResult.time_scale`). A missing tokenizer, a failed run or a JSON line
without the fields of SGLang 0.5.x is a `BenchmarkError` that says which and what to do.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.measure.client import API_KEY_ENV, BenchmarkError, BenchmarkResult, Workload
from autotune.measure.plan import BenchServingOptions
from autotune.node.runner import CommandRunner
from autotune.trial.launch import ServerLaunch

__all__ = [
    "BENCH_SERVING_ENV",
    "FIELDS",
    "BenchServingRun",
    "command",
    "parse_output",
]

MODULE = "sglang.bench_serving"  # 0.5.23 moved it to sglang.benchmark.serving and kept this name as a shim
# bench_serving's JSON field -> BenchmarkResult field; all are required (SGLang 0.5.x writes them all).
FIELDS: Mapping[str, str] = {
    "duration": "duration_s",
    "completed": "completed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput",
    "input_throughput": "input_throughput",
    "output_throughput": "output_throughput",
    "mean_ttft_ms": "mean_ttft_ms",
    "median_ttft_ms": "p50_ttft_ms",
    "p99_ttft_ms": "p99_ttft_ms",
    "mean_itl_ms": "mean_itl_ms",
    "median_itl_ms": "p50_itl_ms",
    "p99_itl_ms": "p99_itl_ms",
    "mean_e2e_latency_ms": "mean_e2e_latency_ms",
    "median_e2e_latency_ms": "p50_e2e_latency_ms",
    "p99_e2e_latency_ms": "p99_e2e_latency_ms",
}
_DURATIONS = ("duration_s",)
_THROUGHPUTS = ("request_throughput", "input_throughput", "output_throughput")
# The Hugging Face libraries must never reach for the network: the tokenizer is a local folder.
BENCH_SERVING_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
INSTALL_HINT = (
    "Install it on the node: pip install sglang --no-deps, plus aiohttp numpy tqdm transformers requests "
    "pybase64 IPython datasets pillow; or set objective bench_serving.command."
)
_SERVER_INFO = (
    "import json, os, sys, urllib.request\n"
    f"key = os.environ.get({API_KEY_ENV!r})\n"
    "auth = {'Authorization': f'Bearer {key}'} if key else {}\n"
    "for path in ('/server_info', '/get_server_info'):\n"
    "    try:\n"
    "        request = urllib.request.Request(sys.argv[1] + path, headers=auth)\n"
    "        print(json.dumps(json.load(urllib.request.urlopen(request, timeout=10))))\n"
    "        break\n"
    "    except Exception:\n"
    "        pass\n"
)


def command(
    base: Sequence[str],
    base_url: str,
    workload: Workload,
    *,
    tokenizer: str,
    output_file: str,
    seed: int,
    extra_args: Sequence[str] = (),
    time_scale: float = 1.0,
) -> list[str]:
    """The bench_serving argv for one workload; `base` starts it (e.g. [python, -m, sglang.bench_serving]).

    A ShareGPT prompts file is its `sharegpt` dataset (the file on the node), lengths `uniform` its
    `--random-range-ratio`, a request rate its `--request-rate` and an SLO its `--goodput` (SGLang 0.5.23+),
    the last two converted to real time by `time_scale` (real seconds per server second)."""
    if workload.prompts is not None:
        dataset = ["--dataset-name", "sharegpt", "--dataset-path", workload.prompts]
        if workload.lengths != "file":
            dataset += ["--sharegpt-output-len", str(workload.output_len)]
    else:
        ratio = workload.range_ratio if workload.lengths == "uniform" else 1.0
        dataset = ["--dataset-name", "random-ids", "--random-input-len", str(workload.input_len)]
        dataset += ["--random-output-len", str(workload.output_len), "--random-range-ratio", str(ratio)]
    load = (
        [] if workload.request_rate is None else ["--request-rate", f"{workload.request_rate / time_scale:g}"]
    )
    slo = workload.slo
    limits = {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms, "e2el": slo.e2el_ms} if slo is not None else {}
    goodput = [f"{key}:{ms * time_scale:g}" for key, ms in limits.items() if ms is not None]
    return [
        *base,
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        *dataset,
        "--tokenizer",
        tokenizer,
        *load,
        *(["--goodput", *goodput] if goodput else []),
        "--num-prompts",
        str(workload.num_prompts),
        "--max-concurrency",
        str(workload.concurrency),
        "--warmup-requests",
        str(workload.warmup_requests),
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--output-file",
        output_file,
        *extra_args,
    ]


def parse_output(text: str, workload: Workload, *, time_scale: float = 1.0) -> BenchmarkResult:
    """The result of bench_serving's `--output-file`: its last JSON line, converted to server time.

    Raises `BenchmarkError` when there is no JSON object, when a field autotune reads is missing or not a
    number, and when no request completed.
    """
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"`time_scale > 0` must hold, but got ({time_scale=}).")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise BenchmarkError("of sglang.bench_serving wrote no result: its output file is empty")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        raise BenchmarkError(
            "of sglang.bench_serving wrote unexpected output: its last line is not JSON",
            first_error=lines[-1][:200],
        ) from None
    if not isinstance(data, dict):
        raise BenchmarkError(
            "of sglang.bench_serving wrote unexpected JSON: not an object", first_error=lines[-1][:200]
        )
    missing = [name for name in FIELDS if name not in data]
    wrong = [name for name in FIELDS if name in data and not _is_number(data[name])]
    if missing or wrong:
        problem = (f"missing {missing}" if missing else "") + (
            f"{'; ' if missing else ''}not numbers {wrong}" if wrong else ""
        )
        raise BenchmarkError(
            f"of sglang.bench_serving wrote unexpected JSON: {problem} (autotune reads SGLang 0.5.x's "
            f"fields: {', '.join(FIELDS)})",
            first_error=f"fields present: {', '.join(sorted(data))}"[:500],
        )
    values: dict[str, Any] = {ours: float(data[theirs]) for theirs, ours in FIELDS.items()}
    for name in _DURATIONS:
        values[name] /= time_scale
    for name in _THROUGHPUTS:
        values[name] *= time_scale
    for name in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p50_itl_ms", "p99_itl_ms"):
        values[name] /= time_scale
    for name in ("mean_e2e_latency_ms", "p50_e2e_latency_ms", "p99_e2e_latency_ms"):
        values[name] /= time_scale
    completed = int(values.pop("completed"))
    accept = data.get("accept_length")
    goodput = _goodput(data, workload, time_scale)
    result = BenchmarkResult(
        workload=workload,
        completed=completed,
        failed=max(0, workload.num_prompts - completed),
        total_input_tokens=int(values.pop("total_input_tokens")),
        total_output_tokens=int(values.pop("total_output_tokens")),
        accept_length=float(accept) if accept is not None and _is_number(accept) else None,
        time_scale=time_scale,
        client="bench_serving",
        request_goodput=goodput[0],
        slo_attainment=goodput[1],
        **values,
    )
    if completed == 0:
        raise BenchmarkError(
            "failed: every request of sglang.bench_serving failed", failed=result.failed, first_error=None
        )
    return result


def _goodput(
    data: Mapping[str, Any], workload: Workload, time_scale: float
) -> tuple[float | None, float | None]:
    """`request_goodput` (per server second) and `slo_attainment`: SGLang 0.5.23+ writes for --goodput."""
    if workload.slo is None:
        return None, None
    goodput, attainment = data.get("request_goodput", ""), data.get("slo_attainment", "")
    if not (_is_number(goodput) and _is_number(attainment)):
        raise BenchmarkError(
            "of sglang.bench_serving wrote no goodput: an SLO needs SGLang 0.5.23 or later on the node "
            "(its --goodput writes request_goodput and slo_attainment)",
            first_error=f"fields present: {', '.join(sorted(data))}"[:500],
        )
    return float(goodput) * time_scale, float(attainment)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _tail(text: str) -> str | None:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), None)


class BenchServingRun:
    """Runs bench_serving for one launch through `runner`: `measure(workload, seed)` per benchmark.

    `launch` is the server's: the tokenizer defaults to its `--model-path`, the client's Python to the
    server's when the server is started as `PYTHON -m ...`, and its `--api-key` reaches bench_serving as
    `OPENAI_API_KEY`, which it sends as `Authorization: Bearer`.
    """

    def __init__(
        self,
        runner: CommandRunner,
        base_url: str,
        launch: ServerLaunch,
        options: BenchServingOptions | None,
        timeout_s: float,
    ) -> None:
        options = options or BenchServingOptions()
        python = launch.python
        self.runner = runner
        self.base_url = base_url.rstrip("/")
        self.python = python
        self.base = list(options.command) if options.command else [python, "-m", MODULE]
        tokenizer = options.tokenizer or launch.model_path
        if tokenizer is None:
            raise BenchmarkError(
                "of sglang.bench_serving has no tokenizer: the launch has no --model-path",
                first_error="set objective bench_serving.tokenizer to a tokenizer folder on the node",
            )
        self.tokenizer = tokenizer
        self.extra_args = list(options.extra_args)
        self.timeout_s = timeout_s
        key = launch.api_key
        self.key_env = {API_KEY_ENV: key} if key else {}
        self._checked = False

    def check_tokenizer(self) -> None:
        """Raise `BenchmarkError` unless the tokenizer folder exists on the node and holds a tokenizer."""
        script = 'd=$1; shift; test -d "$d" || exit 3; for f; do [ -f "$d/$f" ] && exit 0; done; exit 4'
        done = self.runner.run(["sh", "-c", script, "sh", self.tokenizer, *TOKENIZER_FILES], {}, 30)
        if done.returncode == 3:
            raise BenchmarkError(
                f"of sglang.bench_serving cannot start: no tokenizer folder {self.tokenizer} on the node",
                first_error=f"no such folder: {self.tokenizer}; set objective bench_serving.tokenizer to a "
                "local folder holding the model's tokenizer (random-ids needs nothing else, and nothing is "
                "downloaded)",
            )
        if done.returncode != 0:
            raise BenchmarkError(
                f"of sglang.bench_serving cannot start: {self.tokenizer} holds no tokenizer",
                first_error=f"none of {', '.join(TOKENIZER_FILES)} in {self.tokenizer}; point objective "
                "bench_serving.tokenizer at the folder the model's tokenizer was saved to",
            )
        self._checked = True

    def time_scale(self) -> float:
        """The server's `time_scale` from /server_info, asked on the node (1.0 when absent, as on
        SGLang)."""
        done = self.runner.run([self.python, "-c", _SERVER_INFO, self.base_url], self.key_env, 30)
        line = _tail(done.stdout) or ""
        try:
            info = json.loads(line) if done.returncode == 0 and line else {}
        except ValueError:
            info = {}
        value = info.get("time_scale") if isinstance(info, dict) else None
        if value is None:
            return 1.0
        scale = float(value)
        if not (math.isfinite(scale) and scale > 0):
            raise BenchmarkError(f"cannot convert units: the server reported time_scale={value!r}, not > 0")
        return scale

    def measure(self, workload: Workload, seed: int) -> BenchmarkResult:
        """One bench_serving run of `workload` against the launched server."""
        if not self._checked:
            self.check_tokenizer()
        made = self.runner.run(["mktemp", "-d", "-t", "autotune-bench-serving-XXXXXX"], {}, 30)
        folder = made.stdout.strip()
        if made.returncode != 0 or not folder:
            raise BenchmarkError(
                "of sglang.bench_serving cannot start: no temporary folder on the node",
                first_error=_tail(made.stderr),
            )
        output_file = f"{folder}/result.jsonl"
        scale = self.time_scale()
        argv = command(
            self.base,
            self.base_url,
            workload,
            tokenizer=self.tokenizer,
            output_file=output_file,
            seed=seed,
            extra_args=self.extra_args,
            time_scale=scale,
        )
        try:
            try:
                done = self.runner.run(argv, {**BENCH_SERVING_ENV, **self.key_env}, self.timeout_s)
            except TimeoutError:
                raise BenchmarkError(
                    f"did not finish within {self.timeout_s:g} s (sglang.bench_serving)"
                ) from None
            if done.returncode != 0:
                error = _tail(done.stderr) or _tail(done.stdout)
                missing = done.returncode == 127 or "No module named" in (error or "")
                hint = f" {INSTALL_HINT}" if missing else ""
                raise BenchmarkError(
                    f"of sglang.bench_serving failed (exit status {done.returncode}): "
                    f"{shlex.join(argv[:3])} ...{hint}",
                    first_error=error,
                )
            read = self.runner.run(["cat", output_file], {}, 30)
            if read.returncode != 0:
                raise BenchmarkError(
                    "of sglang.bench_serving wrote no result: no output file", first_error=_tail(read.stderr)
                )
            return parse_output(read.stdout, workload, time_scale=scale)
        finally:
            self.runner.run(["rm", "-rf", folder], {}, 30)
