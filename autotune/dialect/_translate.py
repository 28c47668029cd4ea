"""Translating a knob (a flag in the newest SGLang spelling, or an older one) into what one version takes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from autotune.dialect._table import FlagTable, all_committed_tables


@dataclass(frozen=True)
class Held:
    """A knob the server's version does not take: it stays at that version's default."""

    knob: str
    value: str | None
    version: str
    why: str

    def notice(self) -> str:
        return f"{self.knob} is held at its default on SGLang {self.version}: {self.why}"


@dataclass(frozen=True)
class Translation:
    """Flags as the version takes them (in order), and the knobs held at their defaults."""

    flags: dict[str, str | None]
    held: tuple[Held, ...] = ()


@dataclass(frozen=True)
class _Equivalents:
    """Which spellings mean the same setting, learned from every table: option strings of one flag and
    renames (`same`), and old switches that meant one value of a newer flag (`switch_for`)."""

    same: dict[str, frozenset[str]]
    switch_for: dict[str, tuple[str, str]]  # old switch -> (new flag, the value it meant)
    renamed: dict[str, str]  # deprecated spelling -> the one to use

    @classmethod
    def of(cls, tables: Iterable[FlagTable]) -> _Equivalents:
        groups: dict[str, set[str]] = {}
        switch_for: dict[str, tuple[str, str]] = {}
        renamed: dict[str, str] = {}

        def join(names: Iterable[str]) -> None:
            merged: set[str] = set()
            for name in names:
                merged |= groups.get(name, {name})
            for name in merged:
                groups[name] = merged

        for table in tables:
            for flag in table:
                join(flag.options)
                rename = flag.deprecated
                if rename is None or rename.use is None or rename.error is not None:
                    continue
                if rename.value is not None and not flag.takes_value:
                    for option in flag.options:  # `use` may spell the value too: --x-backend=disabled
                        switch_for[option] = (rename.use.split("=", 1)[0], rename.value)
                elif rename.value is None:
                    join([*flag.options, rename.use])
                    renamed.update((option, rename.use) for option in flag.options)
        return cls({k: frozenset(v) for k, v in groups.items()}, switch_for, renamed)


@dataclass
class Dialect:
    """The flags one server version takes, and the translation of a search space's knobs into them.

    A knob keeps its name where the version has it (a deprecated spelling moves to its replacement), else
    takes a name the tables list for the same setting; a knob the version lacks, or a value it refuses,
    is held at the version's default, with one notice per knob through `notice` (once per Dialect:
    make one per study)."""

    table: FlagTable
    notice: Callable[[str], None] = field(default=lambda text: print(f"autotune: {text}", file=sys.stderr))
    _equivalents: _Equivalents = field(init=False, repr=False)
    _noticed: set[str] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        self._equivalents = _Equivalents.of([*all_committed_tables(), self.table])

    @property
    def version(self) -> str:
        return self.table.version or "(unknown version)"

    def translate(self, flags: Mapping[str, str | None]) -> Translation:
        """`flags` (knob -> value, None for a switch) as this version takes them; prints each held knob's
        notice the first time it is held."""
        out: dict[str, str | None] = {}
        held: list[Held] = []
        for knob, value in flags.items():
            result = self.translate_flag(knob, value)
            if isinstance(result, Held):
                held.append(result)
                if knob not in self._noticed:
                    self._noticed.add(knob)
                    self.notice(result.notice())
            else:
                out[result[0]] = result[1]
        return Translation(out, tuple(held))

    def translate_flag(self, knob: str, value: str | None) -> tuple[str, str | None] | Held:
        """The (flag, value) this version takes for `knob` set to `value`, or why it is held."""
        table = self.table
        flag = table.get(knob)
        if flag is not None and (flag.deprecated is None or flag.deprecated.error is None):
            replacement = self._replacement(knob, value)
            if flag.deprecated is not None and replacement is not None:
                return replacement  # the version's own deprecation says where the setting moved
            if flag.accepts(value):
                return knob, value
            return self._held(knob, value, f"it does not take {_shown(value)} ({_takes(flag.choices)})")
        for name in sorted(self._equivalents.same.get(knob, frozenset()) - {knob}):
            other = table.get(name)
            if other is not None and other.deprecated is None and other.accepts(value):
                return name, value
        replacement = self._replacement(knob, value)
        if replacement is not None:
            return replacement
        whole = table.expand_prefix(knob)
        if whole is not None and whole.accepts(value):
            return whole.options[0], value  # SGLang's argparse takes a unique prefix (`--tp`); write it out
        for switch, (target, meant) in sorted(self._equivalents.switch_for.items()):
            older = table.get(switch)
            if target == knob and value == meant and older is not None and older.accepts(None):
                return switch, None  # an older version spells `--x-backend auto` as its switch
        if flag is not None and flag.deprecated is not None:
            return self._held(knob, value, f"SGLang {self.version} refuses it: {flag.deprecated.error}")
        return self._held(knob, value, f"SGLang {self.version} has no such flag (nor another name for it)")

    def _replacement(self, knob: str, value: str | None) -> tuple[str, str | None] | None:
        """Where a deprecated spelling's setting lives in this version: the newer flag (renamed), or the
        newer flag and the value an old switch meant."""
        if knob in self._equivalents.renamed:
            name, meant = self._equivalents.renamed[knob], value
        elif knob in self._equivalents.switch_for and value is None:
            name, meant = self._equivalents.switch_for[knob]
        else:
            return None
        flag = self.table.get(name)
        if flag is None or flag.deprecated is not None or not flag.accepts(meant):
            return None
        return name, meant

    def _held(self, knob: str, value: str | None, why: str) -> Held:
        return Held(knob, value, self.version, why)


def _shown(value: str | None) -> str:
    return "it as a switch" if value is None else repr(value)


def _takes(choices: tuple[str, ...] | None) -> str:
    return f"it takes one of {', '.join(choices)}" if choices else "wrong type or form"
