"""Reading mlrc's YAML files: package-data folders, strict YAML, one-line error messages.

Every mistake in a study, preset, campaign or search-space file becomes one :class:`ConfigError`
whose message names the file and the key (``study.yaml: loss.search.margin: low (2.0) > high
(1.0)``); :func:`format_error` turns pydantic's first error into that line.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from mlrc.errors import first_line


class ConfigError(ValueError):
    """A study, preset or search-space file is wrong; the message says where and what."""


def resource_dir(name: str) -> Path:
    """The folder ``name`` of mlrc's package data (``mlrc/resources/<name>``).

    Found through ``importlib.resources``, so an installed wheel finds it as well as a checkout;
    mlrc is installed as files (never run from a zip), so the folder is a file-system path."""
    return Path(str(files("mlrc.resources").joinpath(name)))


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping (PyYAML keeps the
    last one silently). Keys brought in by a ``<<`` merge may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: SafeLoader says so below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def load_yaml(path: Path | Traversable) -> Any:
    """The YAML document of ``path``; a ConfigError (file, line, column) when it cannot be read,
    is not UTF-8, is malformed or writes a key twice."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        before = raw[: e.start].decode("utf-8")
        line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
        raise ConfigError(
            f"{path}: line {line}, column {column}: not UTF-8 text (byte 0x{raw[e.start]:02x})"
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or first_line(e)
        raise ConfigError(f"{path}: {where}malformed YAML ({problem})") from None


def format_error(source: str, err: ValidationError, model: type[BaseModel]) -> str:
    """The first error of ``err`` (validating ``model``) as one line: ``source: key: problem``,
    with a "did you mean" for an unknown key."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        key = str(e["loc"][-1])
        parent = fields_at(model, e["loc"][:-1])
        close = difflib.get_close_matches(key, parent, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{source}: unknown key {loc!r}{hint}"
    msg = e["msg"].removeprefix("Value error, ")
    msg = re.sub(r" or instance of \w+$", "", msg)  # our class names mean nothing to a user
    if e["type"] == "literal_error":  # pruner: medain → did you mean 'median'?
        options = re.findall(r"'([^']*)'", e.get("ctx", {}).get("expected", ""))
        msg = f"{msg} (got {e['input']!r}){did_you_mean(e['input'], options)}"
    if e["loc"][-1:] == ("[key]",):  # a mapping key that is not a string
        *parent, key = e["loc"][:-1]
        loc = ": ".join([".".join(str(p) for p in parent), f"key {key!r}"]).removeprefix(": ")
    return f"{source}: {loc}: {msg}" if loc else f"{source}: {msg}"


def fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names (and aliases) of the model at ``loc`` ([] where there is none)."""
    found = model_at(model, loc)
    if found is None:
        return []
    return list(found.model_fields) + [f.alias for f in found.model_fields.values() if f.alias]


def model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model at ``loc``: through fields, list items, dict values and ``X | None``."""
    node: Any = model
    for part in loc:
        node = _unwrap_optional(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            fields = {f.alias or name: f for name, f in node.model_fields.items()}
            field = node.model_fields.get(str(part)) or fields.get(str(part))
            node = field.annotation if field is not None else None
        elif typing.get_origin(node) in (list, dict):
            node = typing.get_args(node)[-1]  # the item or value type
        else:
            return None
    node = _unwrap_optional(node)
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def not_a_mapping(data: Any, source: str) -> str:
    """The message for a file (or value) that should be a mapping of keys but is not."""
    if data is None:
        return f"{source}: empty (expected a mapping of keys)"
    return f"{source}: expected a mapping of keys, got {type(data).__name__}"


def validate_model(model: type[BaseModel], data: Any, source: str) -> Any:
    """``data`` validated as ``model``; a one-line ConfigError naming ``source`` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(not_a_mapping(data, source))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(source, e, model)) from None


def did_you_mean(name: str, options: Any) -> str:
    """``"; did you mean 'x'?"`` for the option closest to ``name``, or ""."""
    close = difflib.get_close_matches(str(name), [str(o) for o in options], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
