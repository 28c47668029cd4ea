"""What autotune launches: one trial's settings, the server command built from them, and replay scripts."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from autotune.dialect import Dialect
from autotune.errors import ForbiddenLaunchError
from autotune.trial.redaction import API_KEY_FLAG, Secrets, argv_secrets

# What is secret lives in autotune.trial.redaction; the names stay importable from here.
from autotune.trial.redaction import REDACTED as REDACTED
from autotune.trial.redaction import is_secret_name as is_secret_name

ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # an environment variable name a POSIX shell can export


def is_env_name(name: str) -> bool:
    """True for a name a shell can export (`ENV_NAME`): letters, digits and _, not starting with a digit."""
    return re.fullmatch(ENV_NAME, name) is not None


def to_env_value(value: object) -> str:
    """The string an env var gets for a YAML or sampled value (bools become "1"/"0")."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return to_arg(value)


# A launch's server flags in the order they stand on its command line: each flag with its value, None for a
# switch. Typed where the launch is built (build_server_launch), so nothing reads them back from the argv.
Flags = tuple[tuple[str, str | None], ...]
# SGLang's spellings of the tensor-parallel size (srt/server_args.py): `--tp-size`, its alias
# `--tensor-parallel-size`, and `--tp`, which argparse takes as an abbreviation of `--tp-size`.
TP_FLAGS = ("--tp-size", "--tensor-parallel-size", "--tp")
DP_FLAGS = ("--dp-size", "--data-parallel-size", "--dp")  # the same for data-parallel replicas
MODEL_PATH_FLAG = "--model-path"


def flag_value(flags: Iterable[tuple[str, str | None]], *names: str) -> str | None:
    """The value `flags` give the flag spelled any of `names` (aliases): the last one, as in argparse."""
    return next((value for name, value in reversed(list(flags)) if name in names), None)


def benchmark_python(command: Sequence[str]) -> str:
    """The node's Python for the benchmark: the server command's interpreter when it is `PY -m ...`."""
    return command[0] if len(command) >= 2 and command[1] == "-m" else "python3"


def flag_words(flags: Iterable[tuple[str, str | None]]) -> list[str]:
    """`flags` as command-line words: `--flag value`, or `--flag` alone for a switch."""
    return [word for flag, value in flags for word in ((flag,) if value is None else (flag, value))]


def is_set(value: object) -> bool:
    """Whether a sampled value changes the launch: not None (unset) nor False (a switch off). 0 is set."""
    return value is not None and value is not False


def to_arg(value: object) -> str:
    """The string a command-line argument gets for a YAML or sampled value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # Optuna's stepped floats carry noise (0.8999999999999999); 10 decimals is below any step we use.
        rounded = round(value, 10)
        return str(int(rounded)) if rounded.is_integer() and abs(rounded) < 1e15 else repr(rounded)
    return str(value)


@dataclass(frozen=True)
class TrialConfig:
    """One trial's tuned settings, ready to launch: env vars, server flags, and what was sampled.

    `flags` maps a flag to its value, or to None for a switch without a value. `params` holds the sampled
    values by parameter name (as Optuna stores them); `derived` holds values set by SGLang's rules instead
    of being sampled. An empty TrialConfig is the baseline: SGLang's own defaults.
    """

    env: dict[str, str] = field(default_factory=dict)
    flags: dict[str, str | None] = field(default_factory=dict)
    params: dict[str, object] = field(default_factory=dict)
    derived: dict[str, object] = field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        """True when nothing is tuned: the server runs with SGLang's defaults."""
        return not (self.env or self.flags)


AUTO_PORT = 0  # the port of a launch whose node picks a free one when it starts the server


@dataclass(frozen=True)
class ServerLaunch:
    """How to start one server: its command and the server flags autotune built for it (`flags`, typed:
    what the node and the study read of a launch), the env vars autotune adds to the caller's, and where
    it listens; `secrets`: what its log must not hold besides the secrets its argv and env show by name.
    A launch written as one command (a job, a test's own server) has no `flags`: its argv is its command."""

    command: tuple[str, ...]
    env: dict[str, str]
    host: str
    port: int
    secrets: Secrets = field(default_factory=Secrets, compare=False)
    flags: Flags = ()

    @property
    def argv(self) -> tuple[str, ...]:
        """The command line: the command, then the flags."""
        return (*self.command, *flag_words(self.flags))

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def flag(self, *names: str) -> str | None:
        """The value the launch gives the flag spelled any of `names` (aliases), the last one; None when unset
        or a switch."""
        return flag_value(self.flags, *names)

    @property
    def model_path(self) -> str | None:
        """The model folder the server loads (`--model-path`), None for a launch without typed flags."""
        return self.flag(MODEL_PATH_FLAG)

    @property
    def api_key(self) -> str | None:
        """The server's `--api-key`, which every request must carry."""
        return self.flag(API_KEY_FLAG)

    @property
    def tensor_parallel_size(self) -> int:
        """The TP size the launch gives SGLang (1 when unset); ValueError when it is not an integer."""
        return int(self.flag(*TP_FLAGS) or 1)

    @property
    def python(self) -> str:
        """The node's Python for a benchmark (`benchmark_python` of its command)."""
        return benchmark_python(self.command)

    def with_flag(self, name: str, value: str) -> ServerLaunch:
        """The same launch with the last `name` flag set to `value` (KeyError when it has none)."""
        at = [i for i, (flag, _) in enumerate(self.flags) if flag == name]
        if not at:
            raise KeyError(f"the launch has no {name} flag to set")
        flags = list(self.flags)
        flags[at[-1]] = (name, value)
        return replace(self, flags=tuple(flags))

    def with_node_flags(self, flags: Mapping[str, str]) -> ServerLaunch:
        """The same launch with `flags` set by the node: each taken out where the launch had it, all put
        together before `--host`, where the node's own address flags begin."""
        kept = [(f, v) for f, v in self.flags if f not in flags]
        at = next((i for i, (f, _) in enumerate(kept) if f == "--host"), len(kept))
        kept[at:at] = list(flags.items())
        return replace(self, flags=tuple(kept))

    def with_port(self, port: int) -> ServerLaunch:
        """The same launch listening on `port` (the node fills in an `auto` port just before starting)."""
        return replace(self.with_flag("--port", str(port)), port=port)

    def words(self) -> list[tuple[str, str | None]]:
        """Each argv word with, for a secret value, the name of its flag: the typed flags by their names, the
        command (the user's own words) as redaction reads a command line."""
        words = argv_secrets(self.command)
        for flag, value in self.flags:
            words.append((flag, None))
            if value is not None:
                words.append((value, flag if is_secret_name(flag) else None))
        return words


def build_server_launch(
    *,
    command: Sequence[str],
    model_path: str,
    config: TrialConfig,
    host: str,
    port: int,
    base_flags: Mapping[str, str | None] | None = None,
    base_env: Mapping[str, str] | None = None,
    draft_model_path: str | None = None,
    never_launch_env: Mapping[str, Collection[str]] | None = None,
    never_launch_flags: Collection[str] = (),
    dialect: Dialect | None = None,
) -> ServerLaunch:
    """Build argv as command, --model-path, base flags, trial flags, --host, --port, draft model path.

    With a `dialect` (the node's SGLang version), base and trial flags are spelled as that version takes
    them, and knobs it lacks are left out (held at its default). Raises ForbiddenLaunchError when the
    result would use a never-launch env value or flag.
    """
    flags: list[tuple[str, str | None]] = [(MODEL_PATH_FLAG, model_path)]
    for given in (base_flags or {}, config.flags):
        flags += (dialect.translate(given).flags if dialect is not None else given).items()
    flags += [("--host", host), ("--port", str(port))]
    if draft_model_path is not None:
        flags.append(("--speculative-draft-model-path", draft_model_path))
    launch = ServerLaunch(tuple(command), {**(base_env or {}), **config.env}, host, port, flags=tuple(flags))
    # Forbidden flags are named as the user spells them: check the knobs as well as their translation.
    knobs = tuple((knob, None) for knob in (*(base_flags or {}), *config.flags))
    check_never_launch(
        replace(launch, flags=(*launch.flags, *knobs)), env=never_launch_env or {}, flags=never_launch_flags
    )
    return launch


def check_never_launch(
    launch: ServerLaunch, *, env: Mapping[str, Collection[str]], flags: Collection[str]
) -> None:
    """Raise ForbiddenLaunchError when `launch` sets a forbidden env value or passes a forbidden flag."""
    for name, values in env.items():
        if name in launch.env and launch.env[name] in values:
            raise ForbiddenLaunchError(
                f"refusing to launch with {name}={launch.env[name]}: the study's never_launch forbids it"
            )
    for token in launch.argv:
        flag = token.split("=", 1)[0]
        if flag in flags:
            raise ForbiddenLaunchError(f"refusing to launch with {flag}: the study's never_launch forbids it")


def secret_env_var_for_flag(flag: str) -> str:
    """The env var a replay script reads a secret flag's value from (`--api-key` -> `API_KEY`)."""
    return flag.lstrip("-").split("=", 1)[0].upper().replace("-", "_")


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with secret values replaced by '***' (for MLflow and logs)."""
    return {name: REDACTED if is_secret_name(name) else value for name, value in env.items()}


def redact_argv(launch: ServerLaunch) -> list[str]:
    """The launch's argv with the values of secret flags (`--api-key X`) replaced by '***'."""
    return [REDACTED if secret is not None else token for token, secret in launch.words()]


def launch_script(launch: ServerLaunch) -> str:
    """A bash script that starts this server by hand; secrets are read from the caller's environment."""
    lines = ["#!/usr/bin/env bash", "# Written by autotune: starts the server exactly as the trial did.", ""]
    lines += ["set -euo pipefail", ""]
    for name, value in launch.env.items():
        if is_secret_name(name):
            lines.append(f': "${{{name}:?set {name} in your environment}}"')
            lines.append(f"export {name}")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    words: list[str] = []
    for token, secret_flag in launch.words():
        if secret_flag is None:
            words.append(shlex.quote(token))
            continue
        var = secret_env_var_for_flag(secret_flag)
        lines.append(f': "${{{var}:?set {var} in your environment (the value of {secret_flag})}}"')
        words.append(f'"${var}"')
    lines += ["", "exec " + " ".join(words), ""]
    return "\n".join(lines)


def describe_launch(launch: ServerLaunch) -> str:
    """One copy-pasteable shell line `K=V ... python -m ...`; secrets come from the caller's environment."""
    words = [
        f'{name}="${name}"' if is_secret_name(name) else f"{name}={shlex.quote(value)}"
        for name, value in launch.env.items()
    ]
    for token, secret_flag in launch.words():
        words.append(
            shlex.quote(token) if secret_flag is None else f'"${secret_env_var_for_flag(secret_flag)}"'
        )
    return " ".join(words)
