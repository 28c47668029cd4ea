"""What is secret, and redaction by value: the one home of both, used by everything autotune writes.

A secret is the value of an env var whose name looks secret (`HF_TOKEN`, `WANDB_API_KEY`), of a server
flag whose name does (`--api-key`, `--admin-api-key`, `--ssl-keyfile-password`), or of any `${VAR}` a
study file reads from the environment. Names are caught where a value is written beside its name
(launch lines, MLflow params); `Secrets.redact` catches the value wherever else it shows up (SGLang prints
`api_key='...'` in its `server_args` at start-up, a traceback may quote a command line).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = [
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "SECRET_NAME_PARTS",
    "Secrets",
    "argv_secrets",
    "is_secret_name",
    "redacted_output",
]

# Env var names containing one of these (any case) hold secrets; flags whose dash-separated words include one
# of them (`--api-key`) too. Word match for flags, because `--max-total-tokens` is no secret.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "***"
# Shorter values are not searched for: "1" or "false" in a secret-named var (TOKENIZERS_PARALLELISM)
# would blank every such word of a log. Real keys and tokens are far longer.
MIN_SECRET_LENGTH = 6
API_KEY_FLAG = "--api-key"


def is_secret_name(name: str) -> bool:
    """True when the value of this env var (or `--flag`) must never be written in clear."""
    if name.startswith("--"):
        words = name[2:].split("=", 1)[0].upper().replace("_", "-").split("-")
        return any(part in words for part in SECRET_NAME_PARTS)
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def argv_secrets(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """Each word of a command written as words (the study's `server.command`, any command a runner starts)
    with, for a secret value, the name of its flag; `--f=v` is split into two words. A launch's own flags
    are typed (ServerLaunch.flags) and never read back this way."""
    out: list[tuple[str, str | None]] = []
    pending: str | None = None
    for token in argv:
        if pending is not None and not token.startswith("--"):
            out.append((token, pending))
            pending = None
            continue
        pending = None
        if token.startswith("--") and is_secret_name(token):
            if "=" in token:
                flag, value = token.split("=", 1)
                out += [(flag, None), (value, flag)]
            else:
                out.append((token, None))
                pending = token
            continue
        out.append((token, None))
    return out


@dataclass(frozen=True)
class Secrets:
    """Secret values to replace by `REDACTED` in any text before it is written or shown."""

    values: frozenset[str] = field(default=frozenset(), repr=False)  # a repr must not show them

    @classmethod
    def of(
        cls,
        *,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] = (),
        flags: Iterable[tuple[str, str | None]] = (),
        values: Iterable[str] = (),
    ) -> Secrets:
        """The values of secret-named vars in `env`, of secret flags in the command `argv` and in `flags`
        (typed: flag, value), and `values` themselves."""
        found = {value for name, value in (env or {}).items() if is_secret_name(name)}
        found |= {token for token, flag in argv_secrets(argv) if flag is not None}
        found |= {value for flag, value in flags if value is not None and is_secret_name(flag)}
        found |= set(values)
        return cls(frozenset(v for v in found if len(v.strip()) >= MIN_SECRET_LENGTH))

    @classmethod
    def of_launch(cls, argv: Sequence[str], env: Mapping[str, str], values: Iterable[str] = ()) -> Secrets:
        """What a server started with `argv` and os.environ + `env` knows that must not be written."""
        return cls.of(env={**os.environ, **env}, argv=argv, values=values)

    def __or__(self, other: Secrets) -> Secrets:
        return Secrets(self.values | other.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced by `REDACTED`."""
        if not self.values or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        """`redact` for bytes (a log as written): invalid UTF-8 is kept as it is."""
        if not self.values or not data:
            return data
        return self._bytes_pattern.sub(REDACTED.encode(), data)

    @property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile("|".join(_alternatives(self.values)))

    @property
    def _bytes_pattern(self) -> re.Pattern[bytes]:
        return re.compile(b"|".join(a.encode() for a in _alternatives(self.values)))


def _alternatives(values: Iterable[str]) -> list[str]:
    """Regex alternatives for `values`, longest first, so that no part of a longer one is left."""
    return [re.escape(value) for value in sorted(values, key=len, reverse=True)]


class _RedactingStream:
    """A text stream that redacts what is written before passing it on (the terminal, a pipe)."""

    def __init__(self, stream: TextIO, secrets: Secrets) -> None:
        self._stream = stream
        self._secrets = secrets

    def write(self, text: str) -> int:
        self._stream.write(self._secrets.redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output(secrets: Secrets) -> Iterator[None]:
    """Within the block, what is printed to stdout or stderr (tracebacks too) has `secrets` redacted."""
    if not secrets:
        yield
        return
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout = _RedactingStream(stdout, secrets)
    sys.stderr = _RedactingStream(stderr, secrets)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
