#!/usr/bin/env python3
"""Dump an installed SGLang's server flag table (what `sglang serve` accepts) to a JSON file.

Runs SGLang's own parser code, `ServerArgs.add_cli_args(parser)` from `sglang.srt.server_args`, and writes,
for each option: its option strings, dest, type name, choices, default, nargs/action, the flag a
deprecated alias points to, and the first line of its help. autotune reads these tables from
`autotune/dialect/tables/` to translate a search space's knobs into the flags a node's SGLang takes.

Needs only the standard library and an importable `sglang` (a full install, or an unpacked wheel given
with `--sglang-path`). Where SGLang's heavy dependencies (torch, transformers, ...) are missing,
`--stub-missing` stands in empty modules for them: building the parser does not use them.

    python scripts/dump_sglang_flags.py                      # the installed sglang
    pip download sglang==0.5.23 --no-deps -d w && unzip -q w/*.whl 'sglang/*' -d w/src
    python scripts/dump_sglang_flags.py --sglang-path w/src --stub-missing

The table records how it was made, with the unpacked wheel's folder written `SGLANG_SRC`: where the dump
ran is no part of a committed table.
"""

from __future__ import annotations

import abc
import argparse
import datetime
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

DEFAULT_OUT_DIR = Path(__file__).resolve().parent.parent / "autotune" / "dialect" / "tables"
# "(Deprecated: use --flashinfer-allreduce-fusion-backend=auto) ..." or "Deprecated alias for --x."
_DEPRECATED_HELP = re.compile(r"^[(\[]?deprecated\b[^-]*(--[a-z0-9-]+(?:=[A-Za-z0-9_.-]+)?)?", re.IGNORECASE)


class _Zero:
    """A stand-in read as a number is 0."""

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0


class _StubMeta(_Zero, abc.ABCMeta):  # ABCMeta: SGLang mixes stand-in bases (nn.Module) with ABC
    """A stand-in for anything a missing module exports: a class, a callable, a decorator, a value."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> Any:
        return super().__new__(mcs, name, bases, namespace)  # class keywords (msgspec's frozen=True) dropped

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(name, bases, namespace)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in _STUB_DUNDERS:
            raise AttributeError(name)
        return _stub(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_autotune_stub"):
            try:
                return super().__call__(*args, **kwargs)  # a real class built on a stand-in base
            except TypeError:  # the stand-in base took these arguments (a msgspec.Struct's fields)
                instance = cls.__new__(cls)
                instance.__dict__.update(kwargs)
                return instance
        if (
            len(args) == 1
            and not kwargs
            and isinstance(args[0], types.FunctionType | classmethod | staticmethod)
        ):
            return args[0]  # used as a decorator: keep the function
        return _StubValue()

    def register(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__dict__.get("_autotune_stub"):  # a stand-in's `register(name, fn)`, not ABCMeta's
            return _StubValue()
        return super().register(*args, **kwargs)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __setitem__(cls, item: Any, value: Any) -> None:
        return None

    def __contains__(cls, item: Any) -> bool:
        return False

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __lt__(cls, other: Any) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __mro_entries__(cls, bases: Any) -> tuple[type, ...]:
        return (cls,)


class _StubValue(_Zero, str):
    """What calling a stand-in returns: an empty, false string (`torch.cuda.is_available()` is false,
    `getattr(torch, device)` works) whose attributes, calls and items are stand-ins again."""

    def __new__(cls) -> _StubValue:
        return super().__new__(cls, "")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubValue()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _StubValue()

    def __getitem__(self, item: Any) -> Any:  # type: ignore[override]
        return _StubValue()


def _any_schema(cls: Any, source: Any, handler: Any) -> Any:
    from pydantic_core import core_schema  # only asked for where SGLang's pydantic models use a stand-in

    return core_schema.any_schema()


def _stub(name: str) -> Any:
    namespace = {
        "_autotune_stub": True,
        "__module__": "stub",
        "__get_pydantic_core_schema__": classmethod(_any_schema),
    }
    return _StubMeta(name, (), namespace)


# Other vendors' stacks stay missing (and torch has no such devices), so SGLang takes its CUDA paths.
_ABSENT_MODULES = ("torch_npu", "habana_frameworks", "intel_extension_for_pytorch", "torch_musa", "torch_mlu")
# Library-defined dunders SGLang reads from a dependency's classes (transformers' pydantic-v1 validators).
_STUB_DUNDERS = frozenset({"__class_validators__"})
_ABSENT_ATTRIBUTES = frozenset({"npu", "musa", "mlu", "hpu"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or name in _ABSENT_ATTRIBUTES:
            raise AttributeError(name)
        value = _stub(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: whatever no real finder found (outside sglang itself) becomes a stub."""

    def __init__(self) -> None:
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in ("sglang", *_ABSENT_MODULES):
            return None
        self.stubbed.add(fullname.split(".")[0])
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "99.0.0"  # newer than any version check asks for
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _choices(choices: Any) -> list[Any] | None:
    if choices is None:
        return None
    # A set's order changes from run to run (--sampling-backend); a list's is SGLang's.
    return (
        sorted(_jsonable(list(choices)), key=str)
        if isinstance(choices, set | frozenset)
        else _jsonable(list(choices))
    )


def _type_name(action: argparse.Action) -> str | None:
    kind = action.type
    if kind is None:
        return None
    return getattr(kind, "__name__", None) or type(kind).__name__


def _deprecation(action: argparse.Action) -> dict[str, Any] | None:
    """What a deprecated option stands for: the flag to use instead (and the value it implies)."""
    new_flag = getattr(action, "new_flag", None)
    help_text = (action.help or "").strip()
    kind = type(action).__name__
    if new_flag or kind.startswith("Deprecated"):
        use = {"use": new_flag}
        if hasattr(action, "const_value"):
            use["value"] = _jsonable(action.const_value)
        if getattr(action, "error_message", None):
            use["error"] = action.error_message
        return use
    match = _DEPRECATED_HELP.match(help_text)
    if not match:
        return None
    if not match.group(1):
        return {"use": None}
    flag, _, value = match.group(1).replace(" ", "=").partition("=")
    return {"use": flag, "value": value} if value else {"use": flag}


def flag_table(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """One row per option of `parser` (help and positional arguments left out)."""
    rows = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        row: dict[str, Any] = {
            "options": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "type": _type_name(action),
            "nargs": _jsonable(action.nargs),
            "choices": _choices(action.choices),
            "default": _jsonable(action.default),
            "help": (action.help or "").strip().splitlines()[0][:200] if action.help else "",
        }
        deprecated = _deprecation(action)
        if deprecated is not None:
            row["deprecated"] = deprecated
        rows.append(row)
    return rows


# In DefaultModelLoader (sglang/srt/model_loader/loader.py): the keys --model-loader-extra-config takes,
# the default thread count, and the multithreaded loader's on/off default.
_ALLOWED_KEYS = re.compile(r"allowed_keys\s*=\s*\{([^}]*)\}")
_NUM_THREADS = re.compile(r"DEFAULT_NUM_THREADS\s*=\s*(\d+)")
_MULTITHREAD = re.compile(
    r"""extra_config\.get\(\s*["']enable_multithread_load["']\s*,\s*(True|False)\s*\)"""
)


def loader_defaults(source: str) -> dict[str, Any] | None:
    """The default model loader's `--model-loader-extra-config` keys with SGLang's defaults, read from
    loader.py's text, with the lines read; None where the version has no multithreaded loader."""
    found = {
        name: pattern.search(source)
        for name, pattern in (
            ("allowed_keys", _ALLOWED_KEYS),
            ("DEFAULT_NUM_THREADS", _NUM_THREADS),
            ("_get_weights_iterator", _MULTITHREAD),
        )
    }
    if any(match is None for match in found.values()):
        return None
    keys = {key.strip().strip("\"'") for key in found["allowed_keys"].group(1).split(",")}  # type: ignore[union-attr]
    if "enable_multithread_load" not in keys:
        return None
    lines = ",".join(str(source.count("\n", 0, match.start()) + 1) for match in found.values())  # type: ignore[union-attr]
    return {
        "defaults": {
            "enable_multithread_load": found["_get_weights_iterator"].group(1) == "True",  # type: ignore[union-attr]
            "num_threads": int(found["DEFAULT_NUM_THREADS"].group(1)),  # type: ignore[union-attr]
        },
        "read_from": f"sglang/srt/model_loader/loader.py:{lines} (DefaultModelLoader: {', '.join(found)}) in "
        "the sglang wheel",
    }


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--sglang-path", help="a folder holding the sglang package (an unpacked wheel)")
    cli.add_argument("--stub-missing", action="store_true", help="stand in empty modules for missing deps")
    cli.add_argument(
        "-o", "--output", help="file to write (default: autotune/dialect/tables/sglang-VERSION.json)"
    )
    args = cli.parse_args(argv)
    # How the table was made, without where: the options that shape it, the wheel's folder as SGLANG_SRC.
    made_with = ["--sglang-path", "SGLANG_SRC"] if args.sglang_path else []
    made_with += ["--stub-missing"] if args.stub_missing else []
    if args.sglang_path:
        sys.path.insert(0, args.sglang_path)
    finder = _StubFinder()
    if args.stub_missing:
        sys.meta_path.append(finder)
    from sglang.srt.server_args import ServerArgs  # SGLang's own parser code

    source = Path(sys.modules["sglang"].__file__ or "sglang").resolve().parent
    if args.sglang_path and source.is_relative_to(Path(args.sglang_path).resolve()):
        sglang_from = f"SGLANG_SRC/{source.relative_to(Path(args.sglang_path).resolve())}"
    else:
        sglang_from = f"site-packages/{source.name}"  # an installed sglang

    version = _version(args.sglang_path)
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    table = {
        "sglang_version": version,
        "produced": {
            "by": "scripts/dump_sglang_flags.py (ServerArgs.add_cli_args of sglang.srt.server_args)",
            "command": " ".join(["python", "scripts/dump_sglang_flags.py", *made_with]),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "sglang_from": sglang_from,
            "stubbed_modules": sorted(finder.stubbed),  # empty with a full install
        },
        "flags": flag_table(parser),
    }
    loader_py = source / "srt" / "model_loader" / "loader.py"
    loader = loader_defaults(loader_py.read_text()) if loader_py.is_file() else None
    if loader is not None:
        table["model_loader_extra_config"] = loader
    out = Path(args.output) if args.output else DEFAULT_OUT_DIR / f"sglang-{version}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(table['flags'])} flags of SGLang {version} to {out}")
    return 0


def _version(sglang_path: str | None) -> str:
    """The dumped sglang's version: its package metadata, else its `version.py`."""
    if sglang_path is None:
        try:
            return importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            pass
    from sglang.version import __version__

    return str(__version__)


if __name__ == "__main__":
    sys.exit(main())
