"""A flag table: the options one SGLang version's server parser accepts, from a committed dump or `--help`."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, did_you_mean

TABLES_DIR = Path(__file__).resolve().parent / "tables"
DUMP_SCRIPT = "scripts/dump_sglang_flags.py"


class FlagTableError(AutotuneError):
    """A flag table file that cannot be read."""


@dataclass(frozen=True)
class Deprecation:
    """What a deprecated option stands for: `use` (the flag to pass instead), with `value` when the old
    switch meant one value of it (`--enable-flashinfer-allreduce-fusion` -> `...-fusion-backend auto`)."""

    use: str | None
    value: str | None = None
    error: str | None = None  # SGLang stops at parse time with this message: the option is gone


@dataclass(frozen=True)
class Flag:
    """One option of the server's parser."""

    options: tuple[str, ...]
    dest: str
    takes_value: bool
    type: str | None = None
    choices: tuple[str, ...] | None = None  # as strings, what a command line carries
    nargs: str | int | None = None
    action: str = ""
    default: Any = None
    deprecated: Deprecation | None = None
    help_hidden: bool = False  # argparse.SUPPRESS: absent from --help, accepted all the same

    def accepts(self, value: str | None) -> bool:
        """True when the parser takes `value` after this option (None: the option alone)."""
        if not self.takes_value:
            return value is None
        if value is None:
            return self.nargs in ("?", "*")
        if self.choices is not None and value not in self.choices:
            return False
        return _converts(self.type, value)


def _converts(type_name: str | None, value: str) -> bool:
    converter = {"int": int, "float": float}.get(type_name or "")
    if converter is None:
        return True  # str, or a custom type (human_readable_int, json) the table does not model
    try:
        converter(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class FlagTable:
    """The options a server command accepts; `version`: its SGLang version, `source`: where they came from."""

    version: str | None
    flags: tuple[Flag, ...]
    source: str
    _by_option: dict[str, Flag] = field(init=False, repr=False, compare=False)
    # The keys SGLang's default model loader takes in --model-loader-extra-config, with its defaults (read
    # from that version's source; None where not known, as for a table read from --help).
    loader_defaults: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_option", {o: f for f in self.flags for o in f.options})

    def __contains__(self, option: object) -> bool:
        return option in self._by_option

    def __iter__(self) -> Iterator[Flag]:
        return iter(self.flags)

    def get(self, option: str) -> Flag | None:
        return self._by_option.get(option)

    def expand_prefix(self, option: str) -> Flag | None:
        """The one flag `option` abbreviates, as argparse reads it (None when none, or ambiguous)."""
        if not option.startswith("--"):
            return None
        found = {id(f): f for o, f in self._by_option.items() if o.startswith(option)}
        return next(iter(found.values())) if len(found) == 1 else None

    @property
    def options(self) -> frozenset[str]:
        return frozenset(self._by_option)

    @property
    def digest(self) -> str:
        """8 hex digits that change whenever an option, its value-taking or its choices change."""
        text = "\n".join(
            sorted(
                f"{o} {int(f.takes_value)} {','.join(f.choices or ())}" for f in self.flags for o in f.options
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def parser(self) -> argparse.ArgumentParser:
        """An argparse parser with these options, for checking a command line the way SGLang's does
        (prefixes abbreviate, an ambiguous prefix or an unknown option is an error)."""
        parser = argparse.ArgumentParser(prog="sglang serve", add_help=False, exit_on_error=False)
        for flag in self.flags:
            kwargs: dict[str, Any] = {"dest": flag.dest, "default": None}
            if not flag.takes_value:
                kwargs["action"] = "store_true"
            else:
                if flag.nargs is not None:
                    kwargs["nargs"] = flag.nargs
                if flag.choices is not None:
                    kwargs["choices"] = flag.choices
                converter = {"int": int, "float": float}.get(flag.type or "")
                if converter is not None:
                    kwargs["type"] = converter
            parser.add_argument(*flag.options, **kwargs)
        return parser


def _flag_from_row(row: Mapping[str, Any]) -> Flag:
    nargs = row.get("nargs")
    choices = row.get("choices")
    deprecated = row.get("deprecated")
    return Flag(
        options=tuple(row["options"]),
        dest=row["dest"],
        takes_value=nargs != 0,
        type=row.get("type"),
        choices=tuple(str(c) for c in choices) if choices is not None else None,
        nargs=nargs,
        action=row.get("action", ""),
        default=row.get("default"),
        deprecated=Deprecation(deprecated.get("use"), deprecated.get("value"), deprecated.get("error"))
        if deprecated
        else None,
        help_hidden=row.get("help") == argparse.SUPPRESS,
    )


def load_table(path: Path | str) -> FlagTable:
    """Read a table written by the dump script; a broken file is a FlagTableError naming it and the fix."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        flags = tuple(_flag_from_row(row) for row in data["flags"])
        version = data.get("sglang_version")
        loader = data.get("model_loader_extra_config")
        loader_defaults = dict(loader["defaults"]) if loader is not None else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FlagTableError(
            f"{path}: not a flag table ({type(exc).__name__}: {exc}); write it again with "
            f"`python {DUMP_SCRIPT} -o {path}` where that SGLang is installed"
        ) from None
    version_name = str(version) if version is not None else None
    return FlagTable(version_name, flags, str(path), loader_defaults=loader_defaults)


def committed_versions() -> list[str]:
    """The SGLang versions whose tables ship with autotune, oldest first."""
    names = (p.name.removeprefix("sglang-").removesuffix(".json") for p in TABLES_DIR.glob("sglang-*.json"))
    return sorted(names, key=_version_key)


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"[.+-]", version))


@cache
def committed_table(version: str) -> FlagTable | None:
    """The committed table of exactly this SGLang version, or None."""
    path = TABLES_DIR / f"sglang-{version}.json"
    return load_table(path) if path.is_file() else None


# An option line of argparse's help: "  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE"
_HELP_OPTION = re.compile(r"^\s{1,8}(-{1,2}[A-Za-z0-9][^\s,]*)(.*)$")


def table_from_help(text: str, version: str | None, source: str) -> FlagTable:
    """The options argparse's `--help` output lists (option strings, whether they take a value, `{choices}`);
    types and defaults are not in it."""
    flags: list[Flag] = []
    for line in text.splitlines():
        match = _HELP_OPTION.match(line)
        if not match:
            continue
        options: list[str] = []
        metavar = ""
        invocation = re.split(r"\s{2,}", line.strip())[0]  # help text may follow on the same line
        for part in invocation.split(", "):
            name, _, rest = part.partition(" ")
            if not name.startswith("-"):
                break
            options.append(name)
            metavar = metavar or rest.strip()
        choices = None
        listed = re.match(r"^\[?\{([^}]*)\}", metavar)  # {a,b} or, for nargs, [{a,b} ...]
        if listed:
            choices = tuple(listed.group(1).split(","))
        dest = options[-1].lstrip("-").replace("-", "_")
        if "-h" in options or "--help" in options:
            continue
        flags.append(Flag(tuple(options), dest, takes_value=bool(metavar), choices=choices))
    return FlagTable(version, tuple(flags), source)


def all_committed_tables() -> Sequence[FlagTable]:
    return [t for v in committed_versions() if (t := committed_table(v)) is not None]


def unknown_flag(option: str, tables: Sequence[FlagTable]) -> tuple[str, str] | None:
    """(why, did-you-mean) when no SGLang version of `tables` takes `option` (as written, or as the
    unique prefix argparse expands); None when one does."""
    if not tables or any(option in table or table.expand_prefix(option) is not None for table in tables):
        return None
    versions = sorted({t.version or "of unknown version" for t in tables}, key=_version_key)
    known = f"SGLang {versions[0]} to {versions[-1]}" if len(versions) > 1 else f"SGLang {versions[0]}"
    hint = did_you_mean(option, {o for table in tables for o in table.options}).strip()
    return f"no SGLang version autotune knows ({known}) has this flag", hint
