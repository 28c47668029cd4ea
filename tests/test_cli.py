"""The `autotune` command as a user runs it: a subprocess, its exit status, its output, and what it leaves."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # each test runs the CLI as a user does: a process
REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart.yaml"
SHIPPED_SPACE = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
SHIPPED_OBJECTIVE = REPO / "objectives" / "quickstart.yaml"

# The study lives in a folder of its own; the CLI runs one level up, so relative paths are resolved from
# the study file's folder, and anything written next to the study or in the working dir lands in tmp_path.
STUDY_DIR = "study"
STUDY_ARG = f"{STUDY_DIR}/study.yaml"


def _autotune(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _replace_line(text: str, key: str, value: str) -> str:
    """Set a top-level `key: ...` line of the study file, which must be there."""
    pattern = re.compile(rf"^{re.escape(key)}: .*$", re.MULTILINE)
    assert pattern.search(text), f"the shipped study file has no top-level {key!r} line"
    return pattern.sub(f"{key}: {value}", text, count=1)


def _make_study(root: Path) -> Path:
    """A valid copy of the quickstart study under `root/study/`, naming its own search space and objective."""
    study_dir = root / STUDY_DIR
    study_dir.mkdir()
    (study_dir / "space.yaml").write_text(SHIPPED_SPACE.read_text())
    (study_dir / "objective.yaml").write_text(SHIPPED_OBJECTIVE.read_text())
    text = _replace_line(QUICKSTART.read_text(), "search_space", "space.yaml")
    (study_dir / "study.yaml").write_text(_replace_line(text, "objective", "objective.yaml"))
    return study_dir


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _assert_nothing_created(root: Path, before: list[str]) -> None:
    after = _listing(root)
    created = sorted(set(after) - set(before))
    assert not [p for p in after if ".autotune" in Path(p).parts], created
    assert not [p for p in after if p.endswith(".db")], created
    assert not [p for p in after if "mlruns" in Path(p).parts], created
    assert after == before, f"created: {created}"


def _one_line(stderr: str) -> str:
    lines = stderr.rstrip("\n").split("\n")
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@dataclass(frozen=True)
class BadInput:
    """One mistake: replace `old` by `new` in `file` of the study folder; the message must say the rest.

    `field` may hold `{line}`: the 1-based line where `new` starts in the broken file.
    """

    file: str
    old: str
    new: str
    field: str
    value: object
    fix: str
    problem: str


BAD_INPUTS = [
    pytest.param(
        BadInput(
            "study.yaml",
            "\n  port: auto\n",
            "\n\tport: auto\n",
            "line {line}, column 1",
            "port: auto",
            "Fix the YAML syntax there",
            "malformed YAML: found character '\\t' that cannot start any token",
        ),
        id="malformed-yaml-tab",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree]}",
            "NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree}",
            "line {line}, column 72",
            "NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree}",
            "Fix the YAML syntax there",
            "malformed YAML: expected ',' or ']', but got '}'",
        ),
        id="malformed-yaml-search-space",
    ),
    pytest.param(
        BadInput(
            "study.yaml",
            "\nbudget:",
            "\nbudgte:",
            "budgte",
            "budgte",
            "Did you mean 'budget'?",
            "unknown key",
        ),
        id="unknown-key-study",
    ),
    pytest.param(
        BadInput(
            "study.yaml",
            "\n  model_path:",
            "\n  modle_path:",
            "server.modle_path",
            "modle_path",
            "Did you mean 'model_path'?",
            "unknown key",
        ),
        id="unknown-key-nested",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "high: 0.95, step: 0.01}",
            "high: 0.95, stepp: 0.01}",
            "parameters.--mem-fraction-static.stepp",
            "stepp",
            "Did you mean 'step'?",
            "unknown key",
        ),
        id="unknown-key-search-space",
    ),
    pytest.param(
        BadInput(
            "objective.yaml",
            "workload: {num_prompts:",
            "workload: {num_prompt:",
            "workload.num_prompt",
            "num_prompt",
            "Did you mean 'num_prompts'?",
            "unknown key",
        ),
        id="unknown-key-objective",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "low: 0.70, high: 0.95",
            "low: 0.95, high: 0.70",
            "parameters.--mem-fraction-static.low",
            0.95,
            "Swap them or widen the range.",
            "`low <= high` must hold, but got (low=0.95, high=0.7)",
        ),
        id="low-above-high",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "low: 0.70, high: 0.95, step: 0.01}",
            "low: 0.0, high: 0.95, log: true}",
            "parameters.--mem-fraction-static.low",
            0.0,
            "Use a positive low, or drop `log`.",
            "`low > 0` must hold for `log=True`",
        ),
        id="log-range-low-zero",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "type: int, low: 1, high: 6,",
            "type: int, low: -2, high: 6, log: true,",
            "parameters.--speculative-num-steps.low",
            -2,
            "Use a positive low, or drop `log`.",
            "`low > 0` must hold for `log=True`",
        ),
        id="log-range-low-negative-int",
    ),
    pytest.param(
        BadInput(
            "space.yaml",
            "high: 6, when: {--speculative-algorithm: EAGLE3}}",
            "high: 6, when: {--speculative-algoritm: EAGLE3}}",
            "parameters.--speculative-num-steps.when.--speculative-algoritm",
            "--speculative-algoritm",
            "Did you mean '--speculative-algorithm'?",
            "the condition names an unknown parameter",
        ),
        id="condition-on-unknown-parameter",
    ),
    pytest.param(
        BadInput(
            "objective.yaml",
            "\nmetric: output_throughput",
            "\nmetric: output_througput",
            "metric",
            "output_througput",
            "Did you mean 'output_throughput'?",
            "unknown metric",
        ),
        id="unknown-objective-metric",
    ),
    pytest.param(
        BadInput(
            "objective.yaml",
            "\nmetric: output_throughput",
            "\nmetric: output_throughput\nlimits: {p99_ttft: 60000}",
            "limits.p99_ttft",
            "p99_ttft",
            "Did you mean 'p99_ttft_ms'?",
            "unknown metric",
        ),
        id="unknown-limit-metric",
    ),
    pytest.param(
        BadInput(
            "study.yaml",
            "\nsearch_space: space.yaml",
            "\nsearch_space: spaces/nccl.yaml",
            "search_space",
            "spaces/nccl.yaml",
            "Fix the path; a relative path starts at the study file's folder",
            "no such file",
        ),
        id="missing-search-space-file",
    ),
    pytest.param(
        BadInput(
            "study.yaml",
            "\nobjective: objective.yaml",
            "\nobjective: ../objective.yaml",
            "objective",
            "../objective.yaml",
            "Fix the path; a relative path starts at the study file's folder",
            "no such file",
        ),
        id="missing-objective-file",
    ),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("bad", BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    tmp_path: Path, bad: BadInput, command: str
) -> None:
    study_dir = _make_study(tmp_path)
    broken = study_dir / bad.file
    text = broken.read_text()
    assert text.count(bad.old) >= 1, f"{bad.file} no longer contains {bad.old!r}"
    text = text.replace(bad.old, bad.new, 1)
    broken.write_text(text)
    start = text.index(bad.new) + (1 if bad.new.startswith("\n") else 0)
    field = bad.field.format(line=text.count("\n", 0, start) + 1)
    before = _listing(tmp_path)

    result = _autotune(tmp_path, command, STUDY_ARG)

    assert result.returncode == 2, result.stderr
    message = _one_line(result.stderr)
    assert result.stdout == ""
    assert message.startswith("autotune: error: "), message
    assert f"{bad.file}: {field}: " in message  # the file, then the field
    assert bad.problem in message
    assert f"(got {bad.value!r})" in message
    assert bad.fix in message
    _assert_nothing_created(tmp_path, before)


@pytest.mark.parametrize("command", ["validate", "run"])
def test_missing_study_file(tmp_path: Path, command: str) -> None:
    _make_study(tmp_path)
    before = _listing(tmp_path)

    result = _autotune(tmp_path, command, f"{STUDY_DIR}/studdy.yaml")

    assert result.returncode == 2, result.stderr
    message = _one_line(result.stderr)
    assert message == (
        f"autotune: error: {STUDY_DIR}/studdy.yaml: file not found (got '{STUDY_DIR}/studdy.yaml'). "
        "Check the path (relative paths start at the study file)."
    )
    _assert_nothing_created(tmp_path, before)


def test_run_with_a_non_positive_budget_creates_nothing(tmp_path: Path) -> None:
    _make_study(tmp_path)
    before = _listing(tmp_path)

    result = _autotune(tmp_path, "run", STUDY_ARG, "--n-trials", "0")

    assert result.returncode == 2, result.stderr
    message = _one_line(result.stderr)
    assert f"{STUDY_ARG}: --n-trials: the budget must be positive (got 0). Pass --n-trials 1" in message
    _assert_nothing_created(tmp_path, before)


def test_the_unbroken_copy_validates(tmp_path: Path) -> None:
    """The bad-input cases start from this study: it must be valid, so each failure is its own mistake."""
    _make_study(tmp_path)
    before = _listing(tmp_path)

    result = _autotune(tmp_path, "validate", STUDY_ARG)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("study quickstart: OK\n")
    assert f"storage: sqlite:///{tmp_path / STUDY_DIR / '.autotune' / 'quickstart' / 'optuna.db'}" in (
        result.stdout
    )
    _assert_nothing_created(tmp_path, before)


def test_validate_quickstart_prints_the_baseline_launch(tmp_path: Path) -> None:
    result = _autotune(tmp_path, "validate", str(QUICKSTART))

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "study quickstart: OK"
    assert "baseline launch:" in lines
    launch = lines[lines.index("baseline launch:") + 1]
    assert "python -m autotune.sim.sglang_server" in launch
    assert "--tp-size 8" in launch
    assert "--model-path /models/Kimi-K2.5" in launch
    tokens = shlex.split(launch)
    names = {token.split("=", 1)[0] for token in tokens}
    tuned = set(yaml.safe_load(SHIPPED_SPACE.read_text())["parameters"])
    assert tuned, "the shipped search space tunes nothing"
    assert not names & tuned, f"the baseline sets tuned settings: {sorted(names & tuned)}"
    # Speculation is off in the baseline, so the draft model is not passed either.
    assert "--speculative-draft-model-path" not in names
    assert _listing(tmp_path) == []


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["status"], id="status"),
        pytest.param(["status", "--json"], id="status-json"),
        pytest.param(["best"], id="best"),
    ],
)
def test_a_study_never_run_says_run_it_first(tmp_path: Path, args: list[str]) -> None:
    _make_study(tmp_path)
    before = _listing(tmp_path)

    result = _autotune(tmp_path, *args, STUDY_ARG)

    assert result.returncode != 0
    assert result.stdout == ""
    message = _one_line(result.stderr)
    assert "no study 'quickstart' yet" in message
    assert f"start it with `autotune run {STUDY_ARG}`" in message
    _assert_nothing_created(tmp_path, before)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    study_dir = _make_study(tmp_path)
    study = study_dir / "study.yaml"
    study.write_text(study.read_text().replace("\n  port: auto\n", "\n\tport: auto\n", 1))
    before = _listing(tmp_path)

    result = _autotune(tmp_path, "--debug", "validate", STUDY_ARG)

    assert result.returncode not in (0, 2), result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "autotune.errors.ConfigError: study/study.yaml: line " in result.stderr
    assert "malformed YAML" in result.stderr
    _assert_nothing_created(tmp_path, before)


@pytest.mark.parametrize("command", ["validate", "status"])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path, command: str) -> None:
    """`autotune status ... | head`: no BrokenPipeError traceback, the status of a tool stopped by SIGPIPE."""
    _make_study(tmp_path)
    if command == "status":  # a study with trials: its rows are the output
        assert _autotune(tmp_path, "enqueue", STUDY_ARG, "--set", "mem-fraction-static=0.9").returncode == 0
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first line
    with open(writer, "w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "autotune", command, STUDY_ARG],
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert (done.returncode, done.stderr) == (141, "")


def test_commands_that_launch_nothing_do_not_need_the_studys_secrets(tmp_path: Path) -> None:
    """`${NAME}`s are for the server: status, best, validate, enqueue read a study without them; run
    stops before anything starts, naming the variable."""
    path = _make_study(tmp_path) / "study.yaml"
    unset = "AUTOTUNE_TEST_UNSET_TOKEN"
    hardware = "    SGLANG_SIM_HARDWARE:"
    path.write_text(path.read_text().replace(hardware, f"    HF_TOKEN: ${{{unset}}}\n{hardware}"))
    done = _autotune(tmp_path, "validate", STUDY_ARG)
    assert done.returncode == 0 and f"server.env.HF_TOKEN: reads ${{{unset}}}" in done.stdout, done.stderr
    assert "the commands that launch servers need it" in done.stdout
    assert _autotune(tmp_path, "enqueue", STUDY_ARG, "--set", "mem-fraction-static=0.9").returncode == 0
    read = {
        args: _autotune(tmp_path, *args, STUDY_ARG) for args in [("status",), ("status", "--json"), ("best",)]
    }
    for args, done in read.items():
        assert "is not set" not in done.stderr, args
    assert read[("status",)].returncode == 0
    assert "no completed trial yet" in read[("best",)].stderr
    before = _listing(tmp_path)
    done = _autotune(tmp_path, "run", STUDY_ARG, "--no-ray")
    assert done.returncode == 2
    assert _one_line(done.stderr).endswith(
        f"but {unset} is not set (got '${{{unset}}}'). Set it where autotune runs (export {unset}=...), or "
        "write the value in the file."
    )
    assert _listing(tmp_path) == before, "nothing started, nothing written"


def test_a_flag_no_sglang_version_has_stops_validate_and_run_before_any_trial(tmp_path: Path) -> None:
    """A typo in a search space's flag: an error with a did-you-mean, at validate and at run (after the
    node check, before the NCCL stage), not a knob held at its default through the whole study."""
    study_dir = _make_study(tmp_path)
    space = study_dir / "space.yaml"
    space.write_text(space.read_text().replace("--mem-fraction-static:", "--mem-fraction-statik:", 1))
    expected = (
        "space.yaml: parameters.--mem-fraction-statik: no SGLang version autotune knows (SGLang 0.5.17 to "
        "0.5.23) has this flag (got '--mem-fraction-statik'). Did you mean '--mem-fraction-static'?"
    )
    done = _autotune(tmp_path, "validate", STUDY_ARG)
    assert done.returncode == 2 and expected in _one_line(done.stderr) and done.stdout == ""
    done = _autotune(tmp_path, "run", STUDY_ARG, "--no-ray", "--no-tracking")
    assert done.returncode == 2 and expected in done.stderr.splitlines()[-1], done.stderr
    assert "NCCL stage" not in done.stderr
    workdir = study_dir / ".autotune" / "quickstart"
    assert not list(workdir.rglob("trial-*")) and not (workdir / "nccl-stage").exists(), "no trial ran"


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stop_signal_outside_a_study_ends_the_command_as_ctrl_c_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sig: str, status: int
) -> None:
    # `timeout`, systemd and Slurm send SIGTERM, a closed terminal SIGHUP: a line and 128 + n, as for Ctrl-C.
    import signal
    import time

    import autotune.cli as cli

    def stopped(args: object) -> int:
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(5)  # the handler raises here
        return 0

    monkeypatch.setitem(cli.COMMANDS, "status", stopped)
    # Ctrl-C as a command started from a shell has it (under pytest-xdist, an earlier test in the same
    # worker process left a handler of its own on SIGINT, which did not raise).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["status", str(tmp_path / "study.yaml")]) == status
    finally:
        signal.signal(signal.SIGINT, previous)
    said = "interrupted" if sig == "SIGINT" else f"stopped by {sig}"
    assert capsys.readouterr().err == f"autotune: {said}\n"


def test_an_unreachable_tracking_server_stops_validate_and_run_in_seconds(tmp_path: Path) -> None:
    """Nothing listens on port 9: MLflow found out after four minutes of retries and a long traceback, with
    the baseline left WAITING; the store is asked first, in seconds, before Ray or any trial starts."""
    study_dir = _make_study(tmp_path)
    study = study_dir / "study.yaml"
    study.write_text(study.read_text() + "tracking_uri: http://127.0.0.1:9\n")
    expected = (
        f"autotune: error: {STUDY_ARG}: tracking_uri: no MLflow server answers there (Connection refused) "
        "(got 'http://127.0.0.1:9'). Start that server or fix tracking_uri in the study file, or pass "
        "--no-tracking to run without MLflow."
    )
    before = _listing(tmp_path)
    for command in ("validate", "run"):
        started = time.monotonic()
        done = _autotune(tmp_path, command, STUDY_ARG, *(("--no-ray",) if command == "run" else ()))
        assert time.monotonic() - started < 20, command
        assert done.returncode == 2, done.stderr
        # `run` says which store it uses first, then the error: no traceback, no trial
        assert "Traceback" not in done.stderr and done.stderr.splitlines()[-1] == expected, done.stderr
        assert len(done.stderr.splitlines()) <= 3, done.stderr
        assert _listing(tmp_path) == before, "no study, no trial: nothing written"


def test_a_tracking_store_in_a_folder_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    study_dir = _make_study(tmp_path)
    (tmp_path / "a-file").write_text("")
    study = study_dir / "study.yaml"
    study.write_text(study.read_text() + f"tracking_uri: sqlite:///{tmp_path}/a-file/mlflow.db\n")
    done = _autotune(tmp_path, "validate", STUDY_ARG)
    assert done.returncode == 2
    assert f"tracking_uri: {tmp_path}/a-file is not a folder" in _one_line(done.stderr)
