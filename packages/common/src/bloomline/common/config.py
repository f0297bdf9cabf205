"""Typed config trees: dataclasses loaded from TOML, overridden from the command line.

A config is a tree of dataclasses whose every field has a default and a docstring (the string
literal under the field, as in PEP 257's attribute docstrings); :func:`field_docs` reads those
for ``--help``. :func:`load_config` merges, in order: the defaults, a TOML file, and
``section.key=value`` overrides, checking every key and value against the declared types. An
unknown key names the closest valid one; a bad value names the field and the file or flag it
came from.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import keyword
import textwrap
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from bloomline.common.errors import UserError

__all__ = ["config_to_dict", "field_docs", "load_config", "to_toml", "config_from_dict"]

C = TypeVar("C")


def _hints(cls: type) -> dict[str, Any]:
    """``{config key: type}``. A field named after a Python keyword plus ``_`` (``async_``)
    is the key without the underscore (``checkpoint.async``): the key the user writes."""
    return {_key(name): hint for name, hint in typing.get_type_hints(cls).items()}


def _key(field_name: str) -> str:
    bare = field_name.removesuffix("_")
    return bare if bare != field_name and keyword.iskeyword(bare) else field_name


def _attribute(key: str) -> str:
    return f"{key}_" if keyword.iskeyword(key) else key


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for name, hint in _hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += _all_keys(hint, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _unknown(key: str, root: type, where: str) -> UserError:
    close = difflib.get_close_matches(key, _all_keys(root), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    return UserError(f"{where}: unknown config key {key}{hint}")


def _coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    """``value`` as the declared type ``hint``, or a UserError naming the field."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key, where)
            except UserError as err:
                errors.append(err)
        raise errors[0]
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise UserError(f"{where}: {key} = {value!r}: expected a list")
        item = args[0] if args else Any
        return [_coerce(v, item, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: {key} = {value!r}: expected a table")
        return {str(k): _coerce(v, args[1], f"{key}.{k}", where) for k, v in value.items()}
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where}: {key} = {value!r}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)  # 1e6 in TOML or on the command line
        raise UserError(f"{where}: {key} = {value!r}: expected an integer")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise UserError(f"{where}: {key} = {value!r}: expected a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise UserError(f"{where}: {key} = {value!r}: expected a string")
    raise TypeError(f"config field {key}: unsupported type {hint!r}")


def _merge(instance: Any, table: dict, root: type, where: str, prefix: str = "") -> None:
    hints = _hints(type(instance))
    for name, value in table.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise _unknown(key, root, where)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"{where}: {key} is a section; give it as [{key}] or "
                                f"{key}.FIELD=VALUE")
            _merge(getattr(instance, name), value, root, where, f"{key}.")
        else:
            setattr(instance, _attribute(name), _coerce(value, hint, key, where))


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise UserError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip().removeprefix("--")
    try:  # TOML value syntax: 3, 1e-4, true, "text", [1, 2]
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string: data.corpus=build/demo/corpus
    return key.split("."), value


def load_config(cls: type[C], path: str | Path | None = None,
                overrides: list[str] | None = None) -> C:
    """An instance of the dataclass tree ``cls``: defaults <- TOML file <- overrides.

    Raises:
        UserError: unreadable/invalid TOML (with its line), an unknown key (with the closest
            valid one), a value of the wrong type (naming the field and where it came from).
    """
    config = cls()
    if path is not None:
        path = Path(path)
        try:
            table = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{path}: invalid TOML: {err}") from None
        _merge(config, table, cls, str(path))
    for text in overrides or []:
        parts, value = _parse_override(text)
        nested: dict = {}
        cursor = nested
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _merge(config, nested, cls, f"override {text!r}")
    _post_init_all(config)
    return config


def _post_init_all(instance: Any) -> None:
    """Re-run ``__post_init__`` (derived defaults) after the fields were merged."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value):
            _post_init_all(value)
    if hasattr(instance, "__post_init__"):
        instance.__post_init__()


def config_to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def config_from_dict(cls: type[C], table: dict, where: str = "config") -> C:
    config = cls()
    _merge(config, table, cls, where)
    _post_init_all(config)
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: Any) -> str:
    """The resolved config as TOML that :func:`load_config` reads back to an equal tree
    (``None`` fields are left out: they are the default)."""
    lines: list[str] = []

    def section(instance: Any, name: str) -> None:
        scalars, tables = [], []
        for field in dataclasses.fields(instance):
            value = getattr(instance, field.name)
            if dataclasses.is_dataclass(value):
                tables.append((field.name, value))
            elif value is not None:
                scalars.append(f"{_key(field.name)} = {_toml_value(value)}")
        if scalars:
            if name:
                lines.append(f"\n[{name}]")
            lines.extend(scalars)
        for child, value in tables:
            section(value, f"{name}.{child}" if name else child)

    section(config, "")
    return "\n".join(lines).lstrip("\n") + "\n"


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literals written under each field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, following in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr)
                    and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[_key(node.target.id)] = " ".join(following.value.value.split())
    return docs
