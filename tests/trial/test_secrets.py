"""Secrets: a study whose server takes `--api-key` runs, and no secret value is written anywhere.

The study test runs the real CLI on the simulated SGLang server, which enforces the key as SGLang does and
prints it at start-up as SGLang does (`server_args=ServerArgs(... api_key='...' ...)`), then reads back
every byte the study wrote and everything the commands printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.config._yaml import expand_env_references
from autotune.config.study import load_study
from autotune.errors import ConfigError
from autotune.measure import remote as remote_benchmark
from autotune.measure.client import API_KEY_ENV, BenchmarkError, Workload, benchmark
from autotune.measure.plan import BenchServingOptions
from autotune.node.bench_serving import BenchServingRun
from autotune.node.runner import LocalCommandRunner, free_port
from autotune.trial.launch import TrialConfig, build_server_launch
from autotune.trial.redaction import REDACTED, Secrets, redacted_output
from tests.builders import SEED_MODEL_PATH, SHIPPED_SPACE, SIM_SEED_ARGV, SIM_SERVER, StudyFiles, e2e_study
from tests.conftest import run_cli
from tests.test_objectives import BENCH_SERVING_LINE

API_KEY = "sk-sim-key-7f3a9c2e51"  # given to --api-key, written in clear in the study file
HF_TOKEN = "hf_tokenvalue_b81d44e0"  # the server's env through ${HF_TOKEN}
WANDB_API_KEY = "wandb-key-0c9e1f77aa"  # only in the environment autotune runs in
PASSWORD = "written-in-the-file-5521"  # written in clear in the study file (secret-named env var)
SERVED_NAME = "served-name-3e8d1c"  # a flag no name marks secret, read through ${SERVED_NAME}
SECRET_VALUES = (API_KEY, HF_TOKEN, WANDB_API_KEY, PASSWORD, SERVED_NAME)
N_TRIALS = 3


def _secret_study() -> dict[str, Any]:
    """The shared small study, with its server's key written in clear and HF_TOKEN read from the
    environment, and an NCCL stage of two trials: a study autotune creates for itself, which records the
    same study file."""
    study = e2e_study(N_TRIALS)
    study["server"]["flags"].update({"--api-key": API_KEY, "--served-model-name": "${SERVED_NAME}"})
    study["server"]["env"].update({"HF_TOKEN": "${HF_TOKEN}", "DB_PASSWORD": PASSWORD})
    space = yaml.safe_load(SHIPPED_SPACE.read_text())
    nccl = [name for name, knob in space["parameters"].items() if knob["kind"] == "nccl"]
    for name in nccl[1:]:
        del space["parameters"][name]
    study["search_space"] = space
    study["nccl_stage"] = {"hidden_size": 7168, "command": [sys.executable, "-m", "autotune.sim.nccl_job"]}
    return study


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    secrets = {"HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_API_KEY}  # the key is in the file, not here
    return run_cli(*args, cwd=root, env={**secrets, "SERVED_NAME": SERVED_NAME}, timeout_s=300)


def _leaks(data: bytes) -> list[str]:
    return [value for value in SECRET_VALUES if value.encode() in data]


@pytest.mark.integration
def test_a_study_with_an_api_key_completes_and_writes_no_secret(
    tmp_path: Path, study_file: StudyFiles
) -> None:
    study = study_file(_secret_study())
    # --no-ray: the node actor runs in the CLI's own process, so its stdout and stderr are checked too.
    outputs = {"run": _cli(tmp_path, "run", str(study), "--no-ray")}
    assert outputs["run"].returncode == 0, outputs["run"].stderr[-3000:]
    outputs["status"] = _cli(tmp_path, "status", str(study))
    outputs["status --json"] = _cli(tmp_path, "status", str(study), "--json")
    outputs["best"] = _cli(tmp_path, "best", str(study), "--export", "best.sh")
    outputs["report"] = _cli(tmp_path, "report", str(study), "--out", "report")
    for name, done in outputs.items():
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert not _leaks((done.stdout + done.stderr).encode()), name

    # Every trial was measured or failed for its settings: the client sent the key (without it the
    # simulated server answers 401 and each trial fails as benchmark_error).
    trials = json.loads(outputs["status --json"].stdout)["trials"]
    assert len(trials) == N_TRIALS
    assert [t for t in trials if t["failure_kind"] == "benchmark_error"] == [], trials
    assert sum(t["state"] == "COMPLETE" for t in trials) >= 2, trials

    # Every byte the study wrote: Optuna and MLflow databases, artifacts, server logs, scripts, the report.
    ours = {study, tmp_path / "objective.yaml"}  # the user's own files (the study file holds PASSWORD)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p not in ours]
    assert any(p.suffix == ".db" for p in written) and any(p.name == "launch.sh" for p in written)
    leaked = {str(p.relative_to(tmp_path)): _leaks(p.read_bytes()) for p in written}
    assert {p: v for p, v in leaked.items() if v} == {}

    # The server printed its key (so the scan above could fail) and the log holds it redacted.
    logs = [p for p in written if p.name.endswith(".log") and "server_args=" in p.read_text(errors="replace")]
    assert logs, sorted(str(p.relative_to(tmp_path)) for p in written)
    for log in logs:
        assert f"api_key='{REDACTED}'" in log.read_text(errors="replace")
        assert f"served_model_name='{REDACTED}'" in log.read_text(errors="replace")
    # Each study's recorded study file (the NCCL stage's too) keeps the references, not the values; the
    # values written in it are redacted.
    copies = [p for p in written if p.name == "study.yaml"]
    studies = optuna.get_all_study_names(load_study(study, for_launch=False).storage)
    assert len(studies) == 2 and len(copies) == len(studies), (studies, copies)
    assert all("${HF_TOKEN}" in p.read_text() and "${SERVED_NAME}" in p.read_text() for p in copies)
    assert all(f"DB_PASSWORD: {REDACTED}\n" in p.read_text() for p in copies)
    assert all(f"--api-key: {REDACTED}" in p.read_text() for p in copies)


KEYED_ARGV = [*SIM_SEED_ARGV, "--api-key", API_KEY, "--host", "127.0.0.1"]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulated server started with --api-key, ready (one for the tests below: each only asks it)."""
    tmp_path = tmp_path_factory.mktemp("keyed")
    port = free_port()
    argv = [*KEYED_ARGV, "--port", str(port)]
    process = LocalCommandRunner().start(argv, {"SGLANG_SIM_TIME_SCALE": "0.001"}, tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "The server is fired up" not in (tmp_path / "server.log").read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, process.read_log()[-2000:]
            time.sleep(0.1)
        yield url
    finally:
        process.stop(grace_s=5)
    # The runner wrote the log through its redacting pipe: the key SGLang prints is not in it.
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert f"api_key='{REDACTED}'" in log and API_KEY not in log


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.integration
def test_the_simulated_server_enforces_the_key_as_sglang_does(keyed_server: str) -> None:
    # SGLang 0.5.17 srt/utils/auth.py: 401 {"error": "Unauthorized"} without the Bearer key; /health* free.
    assert _get(keyed_server + "/get_server_info") == (401, b'{"error": "Unauthorized"}')
    assert _get(keyed_server + "/get_server_info", {"Authorization": "Bearer wrong-key"})[0] == 401
    assert _get(keyed_server + "/get_server_info", {"Authorization": f"Bearer {API_KEY}"})[0] == 200
    assert _get(keyed_server + "/health")[0] == 200
    workload = Workload(num_prompts=2, input_len=100, output_len=8, concurrency=2, warmup_requests=1)
    with pytest.raises(BenchmarkError, match="warm-up failed") as info:
        benchmark(keyed_server, workload, timeout_s=30)
    assert "401" in str(info.value.first_error)
    assert benchmark(keyed_server, workload, timeout_s=30, api_key=API_KEY).completed == 2


@pytest.mark.integration
def test_the_benchmark_on_the_node_reads_the_key_from_its_env(keyed_server: str) -> None:
    workload = Workload(num_prompts=2, input_len=100, output_len=8, concurrency=2)
    argv = remote_benchmark.command(sys.executable, keyed_server, workload, 30, 0)
    assert not any(API_KEY in word for word in argv)  # never on a command line (ps shows it)
    runner = LocalCommandRunner()
    done = runner.run(argv, {API_KEY_ENV: API_KEY}, 60)
    assert remote_benchmark.result_from_output(done.returncode, done.stdout, done.stderr).completed == 2
    done = runner.run(argv, {API_KEY_ENV: ""}, 60)
    with pytest.raises(BenchmarkError, match="warm-up failed"):
        remote_benchmark.result_from_output(done.returncode, done.stdout, done.stderr)


# What sglang.bench_serving does with the key (SGLang 0.5.17 benchmark/serving.py get_auth_headers: the
# env's OPENAI_API_KEY as `Authorization: Bearer`), then its result line appended to --output-file.
KEYED_STAND_IN = """
import json, os, sys, urllib.request
args = sys.argv[1:]
key = os.environ.get("OPENAI_API_KEY")
auth = {"Authorization": f"Bearer {key}"} if key else {}
url = args[args.index("--base-url") + 1] + "/get_model_info"
urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=10)  # 401 raises
line = json.loads(sys.argv[1])
line["completed"] = int(args[args.index("--num-prompts") + 1])
with open(args[args.index("--output-file") + 1], "a") as f:
    f.write(json.dumps(line) + "\\n")
"""


@pytest.mark.integration
def test_bench_serving_gets_the_key_as_sglang_reads_it(keyed_server: str, tmp_path: Path) -> None:
    script = tmp_path / "bench_serving_stand_in.py"
    script.write_text(KEYED_STAND_IN)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    options = BenchServingOptions(
        tokenizer=str(tokenizer), command=(sys.executable, str(script), json.dumps(BENCH_SERVING_LINE))
    )
    launch = build_server_launch(
        command=SIM_SERVER,
        model_path=SEED_MODEL_PATH,
        config=TrialConfig(),
        host="127.0.0.1",
        port=30000,
        base_flags={"--tp-size": "8", "--api-key": API_KEY},
    )
    run = BenchServingRun(LocalCommandRunner(), keyed_server, launch, options, timeout_s=60)
    workload = Workload(num_prompts=4, input_len=100, output_len=8, concurrency=2)
    result = run.measure(workload, seed=0)
    # Its request passed, and so did autotune's own /get_server_info on the node (time_scale 0.001).
    assert result.completed == 4 and result.time_scale == pytest.approx(0.001)


def test_env_references_expand_and_an_unset_one_names_file_field_and_variable(tmp_path: Path) -> None:
    data = {"server": {"flags": {"--api-key": "${KEY}"}, "command": ["x", "pre-${KEY}-post"]}}
    expanded, names = expand_env_references("s.yaml", data, {"KEY": "v4lue"})
    assert expanded == {"server": {"flags": {"--api-key": "v4lue"}, "command": ["x", "pre-v4lue-post"]}}
    assert names == ["KEY"]
    with pytest.raises(ConfigError) as info:
        expand_env_references("s.yaml", {"server": {"env": {"HF_TOKEN": "${HF_TOKEN}"}}}, {})
    assert str(info.value) == (
        "s.yaml: server.env.HF_TOKEN: reads ${HF_TOKEN} from the environment, but HF_TOKEN is not set "
        "(got '${HF_TOKEN}'). Set it where autotune runs (export HF_TOKEN=...), "
        "or write the value in the file."
    )


def test_a_value_read_through_a_reference_is_secret_whatever_its_name(
    study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _secret_study()
    data["server"]["flags"]["--api-key"] = "${SIM_API_KEY}"  # a secret flag through a reference too
    data["server"]["env"]["SGLANG_SIM_TIME_SCALE"] = "${SCALE_TEXT}"
    study = study_file(data)
    values = {"SIM_API_KEY": API_KEY, "SERVED_NAME": SERVED_NAME, "HF_TOKEN": HF_TOKEN}
    for name, value in {**values, "SCALE_TEXT": "0.001000"}.items():
        monkeypatch.setenv(name, value)
    loaded = load_study(study)
    assert loaded.env_references == ("SIM_API_KEY", "SERVED_NAME", "SCALE_TEXT", "HF_TOKEN")
    assert loaded.file.server.flags["--api-key"] == API_KEY
    assert {API_KEY, SERVED_NAME, HF_TOKEN, PASSWORD, "0.001000"} <= loaded.secrets.values
    # The launch carries them to the runner, which redacts them from the server's log.
    assert loaded.server_launch(loaded.search_space.baseline()).secrets == loaded.secrets
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ConfigError, match=r"server\.env\.HF_TOKEN: reads \$\{HF_TOKEN\}"):
        load_study(study)


def test_redaction_by_value() -> None:
    secrets = Secrets.of(
        env={"HF_TOKEN": "hf_abcdef", "TOKENIZERS_PARALLELISM": "false", "NCCL_ALGO": "Ring-long"},
        argv=["--api-key", "sk-123456", "--admin-api-key=adm-123456", "--tp-size", "8"],
    )
    # "false" is too short to be searched for (it would blank every such word); NCCL_ALGO is no secret.
    assert secrets.values == {"hf_abcdef", "sk-123456", "adm-123456"}
    text = "api_key='sk-123456', admin_api_key='adm-123456' HF=hf_abcdef false Ring-long"
    assert secrets.redact(text) == "api_key='***', admin_api_key='***' HF=*** false Ring-long"
    assert secrets.redact_bytes(text.encode()) == secrets.redact(text).encode()
    assert "hf_abcdef" not in repr(secrets)
    assert Secrets.of(values=["abc", "abcdefgh"]).redact("abcdefgh abc") == "*** abc"


def test_redacted_output_covers_prints_and_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    import traceback

    with redacted_output(Secrets.of(values=["sk-123456"])):
        print("key sk-123456")
        try:
            raise RuntimeError("could not launch ['--api-key', 'sk-123456']")
        except RuntimeError:
            traceback.print_exc()
    out, err = capsys.readouterr()
    assert out == "key ***\n"
    assert "RuntimeError: could not launch ['--api-key', '***']" in err and "sk-123456" not in err


@pytest.mark.integration
def test_a_server_log_with_a_secret_is_written_redacted_and_whole_at_exit(tmp_path: Path) -> None:
    code = (
        "import sys; print(f\"server_args=ServerArgs(api_key='{sys.argv[2]}')\"); "
        "print('last line'); sys.exit(3)"
    )
    argv = [sys.executable, "-c", code, "--api-key", API_KEY]
    process = LocalCommandRunner().start(argv, {}, tmp_path / "log")
    deadline = time.monotonic() + 30
    while process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # When poll() says it exited, the log already holds every line it printed, the key redacted.
    assert process.read_log() == f"server_args=ServerArgs(api_key='{REDACTED}')\nlast line\n"
    assert process.stop() == 3
