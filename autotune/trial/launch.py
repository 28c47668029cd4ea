"""What autotune launches: one trial's settings, the server command built from them, and replay scripts."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from autotune.dialect import Dialect
from autotune.errors import ForbiddenLaunchError

# What is secret lives in autotune.trial.redaction; the names stay importable from here.
from autotune.trial.redaction import REDACTED as REDACTED
from autotune.trial.redaction import Secrets, argv_secrets
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


def argv_flags(argv: Sequence[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """A server argv read as argparse reads it: each `--flag` with its value in order (`--f=v`, or the next
    token unless that is a flag; None for a switch), and the other words (the command, positionals)."""
    flags: list[tuple[str, str | None]] = []
    words: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--"):
            words.append(token)
        elif "=" in token:
            name, value = token.split("=", 1)
            flags.append((name, value))
        elif index + 1 < len(tokens) and not tokens[index + 1].startswith("--"):
            flags.append((token, tokens[index + 1]))
            index += 1
        else:
            flags.append((token, None))
        index += 1
    return flags, words


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value `argv` gives the flag spelled any of `names` (aliases): the last one, as in argparse."""
    return next((value for name, value in reversed(argv_flags(argv)[0]) if name in names), None)


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
    """How to start one server: argv, the env vars autotune adds to the caller's, and where it listens;
    `secrets`: what its log must not hold besides the secrets its argv and env show by name."""

    argv: tuple[str, ...]
    env: dict[str, str]
    host: str
    port: int
    secrets: Secrets = field(default_factory=Secrets, compare=False)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def with_port(self, port: int) -> ServerLaunch:
        """The same launch listening on `port` (the node fills in an `auto` port just before starting)."""
        argv = list(self.argv)
        index = len(argv) - 1 - argv[::-1].index("--port")
        argv[index + 1] = str(port)
        return replace(self, argv=tuple(argv), port=port)


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
    argv: list[str] = [*command, "--model-path", model_path]
    for flags in (base_flags or {}, config.flags):
        if dialect is not None:
            flags = dialect.translate(flags).flags
        for flag, value in flags.items():
            argv += [flag] if value is None else [flag, value]
    argv += ["--host", host, "--port", str(port)]
    if draft_model_path is not None:
        argv += ["--speculative-draft-model-path", draft_model_path]
    launch = ServerLaunch(argv=tuple(argv), env={**(base_env or {}), **config.env}, host=host, port=port)
    # Forbidden flags are named as the user spells them: check the knobs as well as their translation.
    knobs = (*(base_flags or {}), *config.flags)
    check_never_launch(
        replace(launch, argv=(*launch.argv, *knobs)), env=never_launch_env or {}, flags=never_launch_flags
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


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of `argv` with the values of secret flags (`--api-key X`, `--api-key=X`) replaced by '***'."""
    return [REDACTED if secret is not None else token for token, secret in argv_secrets(argv)]


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
    for token, secret_flag in argv_secrets(launch.argv):
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
    for token, secret_flag in argv_secrets(launch.argv):
        words.append(
            shlex.quote(token) if secret_flag is None else f'"${secret_env_var_for_flag(secret_flag)}"'
        )
    return " ".join(words)
