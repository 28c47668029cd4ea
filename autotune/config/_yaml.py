"""Reading YAML files and turning pydantic's validation errors into one-line `ConfigError`s."""

from __future__ import annotations

import copy
import functools
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo

from autotune.errors import RULE_ERROR, ConfigError, did_you_mean
from autotune.errors import rule_error as rule_error  # the config's models raise it from here
from autotune.trial.launch import ENV_NAME

# What pydantic calls a key the model does not have: in a model, and in a pydantic dataclass.
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")


def switch_or_section(value: Any, fix: str) -> Any:
    """A section that is also a switch (`nccl_stage: off`, `confirm: off`): True or False becomes
    `{enabled: ...}`, a mapping passes; anything else is an error with `fix`. For `mode="before"`."""
    if isinstance(value, bool):
        return {"enabled": value}
    if value is None or isinstance(value, str | int | float | list):
        raise rule_error("not a switch nor a section", value=value, fix=fix)
    return value


class _Missing:
    """Stands for a value that is not in the file at all."""

    def __repr__(self) -> str:
        return "nothing"


MISSING: Any = _Missing()


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys (PyYAML would silently keep the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})", mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@functools.lru_cache(maxsize=64)
def _parsed(text: str, loader: type) -> Any:
    return yaml.load(text, Loader=loader)


def load_yaml_text(text: str, loader: type = yaml.SafeLoader) -> Any:
    """`yaml.load(text, Loader=loader)`, each text parsed once a process and copied after: a study reads
    the same files again and again (its search space, objective, the simulated node's profiles), and PyYAML
    parses one in milliseconds where a copy takes microseconds. An error is raised again each time."""
    return copy.deepcopy(_parsed(text, loader))


def load_yaml(path: Path | str) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping; every problem is a `ConfigError` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            path, "", str(path), "file not found", "Check the path (relative paths start at the study file)."
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            path, "", str(path), "is a directory, not a file", "Point to a .yaml file."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            path,
            "",
            str(path),
            f"cannot be read ({exc})",
            "Check the file's permissions and encoding (UTF-8).",
        ) from None
    try:
        data = load_yaml_text(text, _UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(
            path,
            where,
            _line(text, mark.line) if mark else "",
            f"malformed YAML: {problem}",
            "Fix the YAML syntax there (indentation, quotes, a missing ':' or a tab).",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, "", "", f"malformed YAML: {exc}", "Fix the YAML syntax.") from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError(
            path,
            "",
            data,
            f"the top level must be a mapping of keys, but the file is {kind}",
            _top_level_fix(),
        )
    return data


# `${NAME}` in a string value of a study file: the value of env var NAME where the study is loaded.
ENV_REFERENCE = re.compile(rf"\$\{{({ENV_NAME})\}}")


def expand_env_references(
    path: Path | str,
    data: Any,
    environ: Mapping[str, str] | None = None,
    *,
    unset: list[ConfigError] | None = None,
) -> tuple[Any, list[str]]:
    """`data` with every `${NAME}` in its string values replaced by env var NAME, and the names read.

    Raises `ConfigError` naming the file, the field and the variable when one is not set; with `unset`
    given, that error is appended to it instead and the `${NAME}` stays as written.
    """
    env = os.environ if environ is None else environ
    names: list[str] = []

    def expand(value: Any, loc: tuple[str | int, ...]) -> Any:
        if isinstance(value, dict):
            return {k: expand(v, (*loc, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [expand(v, (*loc, i)) for i, v in enumerate(value)]
        if not isinstance(value, str):
            return value

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                error = ConfigError(
                    path,
                    _dotted(loc),
                    value,
                    f"reads ${{{name}}} from the environment, but {name} is not set",
                    f"Set it where autotune runs (export {name}=...), or write the value in the file.",
                )
                if unset is None:
                    raise error
                unset.append(error)
                return match.group(0)
            names.append(name)
            return env[name]

        return ENV_REFERENCE.sub(one, value)

    return expand(data, ()), list(dict.fromkeys(names))


def _line(text: str, index: int) -> str:
    lines = text.splitlines()
    # At the end of the file the mark points past the last line; the last line is where the fix goes.
    return lines[min(index, len(lines) - 1)].strip() if lines and index >= 0 else ""


def _top_level_fix() -> str:
    return "Write 'key: value' lines at the top level."


def config_error_from_validation(
    path: Path | str, error: ValidationError, model: type[BaseModel], *, prefix: tuple[str | int, ...] = ()
) -> ConfigError:
    """Turn pydantic's first validation error into one `ConfigError`: dotted field, value, fix."""
    errors = error.errors(include_url=False)
    first = errors[0]
    if first["type"] == "missing":
        # A misspelled key shows up as "missing" plus "unknown key" beside it; the latter says more.
        parent = tuple(first["loc"])[:-1]
        first = next(
            (e for e in errors if e["type"] in _UNKNOWN_KEY and tuple(e["loc"])[:-1] == parent), first
        )
    loc = tuple(first["loc"])
    ctx = first.get("ctx") or {}
    kind = first["type"]
    walked = _walk(model, loc)
    field_loc = list(walked.loc)
    value = first.get("input", MISSING)

    if kind == RULE_ERROR:
        field_loc += list(ctx.get("loc", ()))
        value = ctx.get("value", MISSING)
        problem, fix = first["msg"], str(ctx.get("fix", ""))
    elif kind in _UNKNOWN_KEY:
        key = str(loc[-1])
        allowed = sorted(walked.parent_fields)
        value = key
        problem = "unknown key"
        fix = (did_you_mean(key, allowed).strip() + " " if allowed else "") + (
            f"Allowed keys: {', '.join(allowed)}." if allowed else "Remove it."
        )
    elif kind == "missing":
        value = MISSING
        problem = "required key is missing"
        fix = f"Add '{loc[-1]}'."
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = str(ctx.get("discriminator", "'type'")).strip("'")
        field_loc.append(tag)
        tags = walked.tags
        if kind == "union_tag_not_found":
            value, problem = MISSING, f"required key '{tag}' is missing"
        else:
            value, problem = ctx.get("tag"), f"unknown {tag}"
        hint = did_you_mean(str(value), tags).strip() if kind == "union_tag_invalid" else ""
        fix = f"{hint} Use one of: {', '.join(tags)}.".strip()
    elif kind == "literal_error":
        options = [str(o) for o in walked.literals]
        problem = "not an allowed value"
        hint = did_you_mean(str(value), options).strip()
        fix = f"{hint} Use one of: {', '.join(options)}.".strip() if options else first["msg"]
    else:
        problem, fix = _plain_problem(kind, ctx, first["msg"])
    return ConfigError(path, _dotted((*prefix, *field_loc)), value, problem, fix)


def _plain_problem(kind: str, ctx: Mapping[str, Any], msg: str) -> tuple[str, str]:
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    for name, op in bounds.items():
        if kind == name:
            limit = next(iter(ctx.values()), "?")
            return f"must be {op} {limit}", f"Use a value {op} {limit}."
    table = {
        "int": ("must be a whole number", "Write an integer such as 8."),
        "float": ("must be a number", "Write a number such as 0.9."),
        "bool": ("must be true or false", "Write true or false."),
        "string": ("must be a string", "Write a string (quote it if YAML reads it as something else)."),
        "dict": ("must be a mapping", "Write 'key: value' entries under it."),
        "model": ("must be a mapping", "Write 'key: value' entries under it."),
        "dataclass": ("must be a mapping", "Write 'key: value' entries under it."),
        "list": ("must be a list", "Write a list such as [a, b]."),
    }
    for prefix, answer in table.items():
        if kind.startswith(prefix):
            return answer
    return msg[:1].lower() + msg[1:], "Correct this value."


def _dotted(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Walk:
    """What a pydantic error location points at: the location without union tags, and the model around it."""

    def __init__(self) -> None:
        self.loc: list[str | int] = []
        self.parent_fields: list[str] = []
        self.tags: list[str] = []
        self.literals: list[Any] = []


def _walk(model: type[BaseModel], loc: tuple[str | int, ...]) -> _Walk:
    out = _Walk()
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        members = _model_members(annotation)
        tags = {t: m for m in members for t in _tags_of(m)}
        if len(members) > 1 and isinstance(part, str) and part in tags:
            annotation = tags[part]  # a discriminated union's tag: not a key the user wrote
            continue
        out.loc.append(part)
        if len(members) == 1:
            fields = _fields(members[0])
            out.parent_fields = [f.alias or name for name, f in fields.items()]
            field = fields.get(str(part)) or next((f for f in fields.values() if f.alias == part), None)
            annotation = field.annotation if field is not None else None
        elif typing.get_origin(annotation) in (dict, Mapping):
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) in (list, tuple):
            annotation = typing.get_args(annotation)[0]
        else:
            annotation = None
    annotation = _unwrap(annotation)
    out.tags = list(dict.fromkeys(t for m in _model_members(annotation) for t in _tags_of(m)))
    if typing.get_origin(annotation) is typing.Literal:
        out.literals = list(typing.get_args(annotation))
    return out


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional so that the walk sees the real type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) == 1:
                annotation = args[0]
            else:
                return annotation
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    """A pydantic model, or a pydantic dataclass (the wire types of autotune.measure are)."""
    return isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or is_pydantic_dataclass(annotation)
    )


def _fields(model: Any) -> dict[str, FieldInfo]:
    return dict(model.model_fields if issubclass(model, BaseModel) else model.__pydantic_fields__)


def _model_members(annotation: Any) -> list[Any]:
    if _is_model(annotation):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if _is_model(a)]
    return []


def _tags_of(model: Any) -> list[str]:
    field = _fields(model).get("type")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return []
    return [str(a) for a in typing.get_args(field.annotation)]
