"""Building server launches, replay scripts, and keeping secrets out of them."""

from __future__ import annotations

import shlex

import pytest

from autotune.errors import ForbiddenLaunchError
from autotune.trial.launch import (
    AUTO_PORT,
    TP_FLAGS,
    Flags,
    ServerLaunch,
    TrialConfig,
    build_server_launch,
    check_never_launch,
    describe_launch,
    flag_value,
    flag_words,
    is_secret_name,
    launch_script,
    redact_argv,
    redact_env,
    to_arg,
    to_env_value,
)

COMMAND = ("python", "-m", "sglang.launch_server")


def _launch(
    env: dict[str, str], flags: Flags = (("--model-path", "/m"),), command: tuple[str, ...] = COMMAND
) -> ServerLaunch:
    return ServerLaunch(command=command, env=env, host="127.0.0.1", port=30000, flags=flags)


def test_argv_order_is_command_model_base_trial_host_port_draft() -> None:
    config = TrialConfig(
        env={"NCCL_ALGO": "Ring"},
        flags={"--mem-fraction-static": "0.9", "--disable-custom-all-reduce": None},
    )
    launch = build_server_launch(
        command=COMMAND,
        model_path="/models/Kimi K2",
        config=config,
        host="0.0.0.0",
        port=31000,
        base_flags={"--tp-size": "8", "--trust-remote-code": None},
        base_env={"HF_HOME": "/cache", "NCCL_ALGO": "Tree"},
        draft_model_path="/models/eagle3",
    )
    assert launch.argv == (
        *COMMAND,
        "--model-path",
        "/models/Kimi K2",
        "--tp-size",
        "8",
        "--trust-remote-code",
        "--mem-fraction-static",
        "0.9",
        "--disable-custom-all-reduce",
        "--host",
        "0.0.0.0",
        "--port",
        "31000",
        "--speculative-draft-model-path",
        "/models/eagle3",
    )
    assert launch.env == {"HF_HOME": "/cache", "NCCL_ALGO": "Ring"}  # the trial's value wins
    assert launch.base_url == "http://0.0.0.0:31000"


def test_build_refuses_never_launch_values() -> None:
    with pytest.raises(ForbiddenLaunchError, match="NCCL_NVLS_ENABLE=1"):
        build_server_launch(
            command=COMMAND,
            model_path="/m",
            config=TrialConfig(env={"NCCL_NVLS_ENABLE": "1"}),
            host="127.0.0.1",
            port=30000,
            never_launch_env={"NCCL_NVLS_ENABLE": ["1", "2"]},
        )
    ok = build_server_launch(
        command=COMMAND,
        model_path="/m",
        config=TrialConfig(env={"NCCL_NVLS_ENABLE": "0"}),
        host="127.0.0.1",
        port=30000,
        never_launch_env={"NCCL_NVLS_ENABLE": ["1", "2"]},
        never_launch_flags=["--enable-nccl-nvls"],
    )
    assert ok.env == {"NCCL_NVLS_ENABLE": "0"}


@pytest.mark.parametrize("token", ["--enable-nccl-nvls", "--enable-nccl-nvls=true"])
def test_check_never_launch_flags(token: str) -> None:
    with pytest.raises(ForbiddenLaunchError, match="--enable-nccl-nvls"):
        check_never_launch(_launch({}, command=(*COMMAND, token)), env={}, flags=["--enable-nccl-nvls"])
    check_never_launch(_launch({}, (("--enable-torch-symm-mem", None),)), env={}, flags=["--enable-symm-mem"])


def test_script_quotes_spaces_quotes_and_dollars() -> None:
    tricky = {"A": "two words", "B": 'it\'s "quoted"', "C": "$HOME and `ls` and $(rm -rf /)", "D": ""}
    flags: Flags = (("--model-path", "/models/my model"), ("--chat-template", "{{ $x }}'"))
    argv = (*COMMAND, "--model-path", "/models/my model", "--chat-template", "{{ $x }}'")
    script = launch_script(_launch(tricky, flags))
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
    exports = [line for line in lines if line.startswith("export ")]
    # shlex parses like bash for these quoted words: each line gives back exactly the value.
    assert [shlex.split(line) for line in exports] == [["export", f"{k}={v}"] for k, v in tricky.items()]
    (command_line,) = [line for line in lines if line.startswith("exec ")]
    assert shlex.split(command_line) == ["exec", *argv]
    # `$`, backticks and quotes sit inside single quotes, where bash expands nothing.
    assert "export C='$HOME and `ls` and $(rm -rf /)'" in lines


def test_script_reads_secrets_from_the_callers_environment() -> None:
    env = {"HF_TOKEN": "hf_verysecret", "MY_API_KEY": "k-123", "NCCL_ALGO": "Ring"}
    # A secret flag the launch was built with, and one written into the study's command (read as words).
    command = (*COMMAND, "--admin-api-key=sk-admin")
    script = launch_script(_launch(env, (("--model-path", "/m"), ("--api-key", "sk-flag")), command))
    for secret in ("hf_verysecret", "k-123", "sk-flag", "sk-admin"):
        assert secret not in script
    assert ': "${HF_TOKEN:?set HF_TOKEN in your environment}"' in script
    assert "export HF_TOKEN\n" in script
    assert "export NCCL_ALGO=Ring" in script
    assert '--api-key "$API_KEY"' in script and '--admin-api-key "$ADMIN_API_KEY"' in script
    assert ': "${API_KEY:?' in script


def test_describe_launch_is_one_redacted_line() -> None:
    env = {"NCCL_ALGO": "Ring", "HF_TOKEN": "hf_verysecret", "X": "a b"}
    line = describe_launch(_launch(env, (("--model-path", "/my models/k2"), ("--api-key", "sk-1"))))
    assert "\n" not in line
    assert "hf_verysecret" not in line and "sk-1" not in line
    assert line == (
        "NCCL_ALGO=Ring HF_TOKEN=\"$HF_TOKEN\" X='a b' python -m sglang.launch_server "
        "--model-path '/my models/k2' --api-key \"$API_KEY\""
    )


def test_redact_env_and_argv() -> None:
    env = {"HF_TOKEN": "t", "aws_secret_access_key": "s", "DB_PASSWORD": "p", "NCCL_ALGO": "Ring"}
    assert redact_env(env) == {
        "HF_TOKEN": "***",
        "aws_secret_access_key": "***",
        "DB_PASSWORD": "***",
        "NCCL_ALGO": "Ring",
    }
    assert env["HF_TOKEN"] == "t"  # a copy
    flags: Flags = (("--api-key", "sk"), ("--max-total-tokens", "100"), ("--tp-size", "8"))
    assert redact_argv(_launch({}, flags, ("serve", "--api-key=sk2"))) == [
        "serve",
        "--api-key",
        "***",
        "--api-key",
        "***",
        "--max-total-tokens",
        "100",
        "--tp-size",
        "8",
    ]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("hf_token", True),
        ("OPENAI_API_KEY", True),
        ("MY_SECRET", True),
        ("PGPASSWORD", True),
        ("NCCL_ALGO", False),
        ("--api-key", True),
        ("--max-total-tokens", False),
        ("--speculative-num-draft-tokens", False),
        ("--tp-size", False),
    ],
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_value_text() -> None:
    assert to_env_value(True) == "1" and to_env_value(False) == "0"
    assert to_env_value(1048576) == "1048576"
    assert to_arg(0.8999999999999999) == "0.9"
    assert to_arg(0.85) == "0.85"
    assert to_arg(2.0) == "2"
    assert to_arg(1e-5) == "1e-05"
    assert to_arg("EAGLE3") == "EAGLE3"


def test_the_launch_s_flags_are_typed_where_it_is_built_and_read_from_there() -> None:
    launch = build_server_launch(
        command=COMMAND,
        model_path="/models/k2",
        config=TrialConfig(flags={"--tp-size": "2", "--api-key": "sk-trial"}),
        host="127.0.0.1",
        port=AUTO_PORT,
        base_flags={"--tp": "4", "--trust-remote-code": None},
    )
    assert launch.flags == (
        ("--model-path", "/models/k2"),
        ("--tp", "4"),
        ("--trust-remote-code", None),
        ("--tp-size", "2"),
        ("--api-key", "sk-trial"),
        ("--host", "127.0.0.1"),
        ("--port", "0"),
    )
    assert launch.argv == (*COMMAND, *flag_words(launch.flags))
    # Aliases: the last one given wins, whichever spelling it has, as in argparse.
    assert launch.tensor_parallel_size == 2 and flag_value(launch.flags[:3], *TP_FLAGS) == "4"
    assert (launch.model_path, launch.api_key, launch.python) == ("/models/k2", "sk-trial", "python")
    assert launch.flag("--mem-fraction-static") is None and launch.flag("--trust-remote-code") is None
    placed = launch.with_port(31234)
    assert (placed.port, placed.flag("--port"), placed.argv[-2:]) == (31234, "31234", ("--port", "31234"))
    # A launch written as one command (a job) has no typed flags: nothing is read back from its words.
    job = ServerLaunch(("python", "job.py", "--tp-size", "8"), {}, "127.0.0.1", AUTO_PORT)
    assert job.flags == () and job.tensor_parallel_size == 1 and job.model_path is None
    with pytest.raises(KeyError, match="--port"):
        job.with_port(1)
