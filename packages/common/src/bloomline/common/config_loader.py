"""Typed config trees: dataclasses loaded from TOML, overridden from the command line.

A config is a tree of dataclasses whose every field has a default and a docstring (the string
literal under the field, as in PEP 257's attribute docstrings); :func:`field_docs` reads those
for ``--help``. :func:`load_config` merges, in order: the defaults, a TOML file, and
``section.key=value`` overrides, checking every key and value against the declared types. An
unknown key names the closest valid ones (:func:`key_suggestions`); a bad value names the field
and the file or flag it came from. An override of one entry of a table field
(``data.weights.wiki=0.3``) sets that entry and keeps the others. :func:`describe_keys` lists
every key for ``--doc``; :func:`path_field` marks the fields :func:`resolve_paths` makes
absolute.

A field's allowed values are declared with it, ``lr: float = ranged(3e-4, gt=0)`` (bounds, or
``choices``), and checked for every value merged in (:func:`load_config`,
:func:`config_from_dict`) and, for a tree built in code, by :func:`check_ranges`. Whatever the
declaration, a float must be finite (nan and inf are refused unless the field says
``nonfinite=True``) and an integer must fit in 64 bits; for a list or table field the range
holds for each number or string in it.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import inspect
import json
import keyword
import math
import os
import sys
import textwrap
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular

__all__ = ["Range", "check_ranges", "config_from_dict", "config_to_dict", "describe_keys", "freeze",
           "thawed_copy",
           "field_docs", "field_range", "key_suggestions", "load_config", "path_field", "ranged",
           "resolve_paths", "to_toml"]

C = TypeVar("C")

RANGE = "range"  # the dataclasses.field metadata key of a field's Range
PATH = "path"  # the metadata key of a path field's PathKind
_INT64 = (-2**63, 2**63 - 1)


def _number(value: Any) -> str:
    """A bound as the messages write it: 2**40, 2**32 - 1 and 1e8 rather than their digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 2**16:
        exact = _number(int(value))
        if "*" in exact:
            return exact
        mantissa, exponent = f"{value:e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    if isinstance(value, int) and abs(value) >= 2**16:
        for exponent in range(16, 65):
            if abs(value) == 2**exponent:
                return f"{'-' if value < 0 else ''}2**{exponent}"
            if value == 2**exponent - 1:
                return f"2**{exponent} - 1"
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a config field allows: bounds (``ge``/``gt`` below, ``le``/``lt`` above), or
    ``choices``. ``nonfinite``: a float field that also takes nan and inf."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    nonfinite: bool = False

    def __post_init__(self) -> None:
        if self.ge is not None and self.gt is not None or (
                self.le is not None and self.lt is not None):
            raise TypeError("a range takes one lower bound (ge or gt) and one upper (le or lt)")
        if self.choices is not None and any(
                bound is not None for bound in (self.ge, self.gt, self.le, self.lt)):
            raise TypeError("a range takes either choices or bounds")

    def describe(self) -> str:
        """``> 0``, ``in [0, 1)``, ``one of adamw, lamb``: what the messages and the help say."""
        if self.choices is not None:
            return "one of " + ", ".join(str(choice) for choice in self.choices)
        low = (("[", self.ge) if self.ge is not None
               else ("(", self.gt) if self.gt is not None else None)
        high = (("]", self.le) if self.le is not None
                else (")", self.lt) if self.lt is not None else None)
        if low and high:
            return f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
        if high:
            return f"{'<=' if high[0] == ']' else '<'} {_number(high[1])}"
        return "any value"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` (a coerced scalar) is not allowed, or None when it is."""
        if self.choices is not None:
            if value in self.choices:
                return None
            return "expected one of " + ", ".join(str(choice) for choice in self.choices)
        if not isinstance(value, int | float):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            if not self.nonfinite:
                return "not a finite number" + self._must("; must be {}")
            if math.isnan(value):
                return None
        if (self.ge is not None and not value >= self.ge
                or self.gt is not None and not value > self.gt
                or self.le is not None and not value <= self.le
                or self.lt is not None and not value < self.lt):
            return f"must be {self.describe()}"
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            return "does not fit in a 64-bit integer" + self._must(" (must be {})")
        return None

    def _must(self, template: str) -> str:
        """``template`` with the range, or nothing for a field that declares none."""
        described = self.describe()
        return template.format(described) if described != "any value" else ""


_ANY = Range()  # the checks every field gets: finite floats, 64-bit integers


def ranged(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, choices: typing.Iterable | None = None,
           nonfinite: bool = False) -> Any:
    """A dataclass field with its allowed values: ``lr: float = ranged(3e-4, gt=0)``,
    ``name: str = ranged("adamw", choices=("adamw", "lamb"))``. For a list or table field the
    range holds for each item (``ranged(default_factory=list, ge=0)``)."""
    rng = Range(ge=ge, gt=gt, le=le, lt=lt,
                choices=tuple(choices) if choices is not None else None, nonfinite=nonfinite)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={RANGE: rng})


@dataclasses.dataclass(frozen=True)
class PathKind:
    """What makes a string field's value a path that :func:`resolve_paths` makes absolute:
    ``names``, values that are words rather than paths (``auto``, ``none``); ``if_exists``,
    a value that names no existing file or folder is a name, not a path (``tiktoken:NAME``)."""

    names: tuple[str, ...] = ()
    if_exists: bool = False


def path_field(default: str = "", *, names: typing.Iterable[str] = (),
               if_exists: bool = False) -> Any:
    """A string field that holds a file or folder (``corpus: str = path_field()``): made
    absolute by :func:`resolve_paths`, shown as type ``path`` by :func:`describe_keys`."""
    return dataclasses.field(default=default, metadata={PATH: PathKind(tuple(names),
                                                                       if_exists)})


def resolve_paths(config: Any, base: str | Path | None = None) -> None:
    """Make every path field of the dataclass tree ``config`` (:func:`path_field`) absolute,
    relative to ``base`` (default: the working directory), in place. Empty values, the
    field's ``names`` and, for ``if_exists`` fields, values that name nothing on disk are
    left as they are. Symbolic links are kept (the path the user gave, made absolute)."""
    root = Path(base) if base is not None else Path.cwd()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            resolve_paths(value, root)
            continue
        kind = field.metadata.get(PATH)
        if kind is None or not isinstance(value, str) or not value or value in kind.names:
            continue
        path = root / Path(value).expanduser()
        if kind.if_exists and not path.exists():
            continue
        setattr(config, field.name, os.path.normpath(path))


def field_range(field: dataclasses.Field) -> Range | None:
    """The Range a field was declared with (None: none declared)."""
    return field.metadata.get(RANGE)


@functools.cache
def _ranges(cls: type) -> dict[str, Range]:
    """``{config key: Range}`` of the fields of ``cls`` (the common checks where none is
    declared)."""
    return {_key(field.name): field_range(field) or _ANY for field in dataclasses.fields(cls)}


def _check_value(value: Any, rng: Range, key: str, where: str, shown: Any = None) -> None:
    """A UserError naming ``key``, ``value`` and the range when a scalar is out of it;
    ``shown``: the value as the user wrote it (1e30 rather than its integer's digits)."""
    problem = rng.problem(value)
    if problem is not None:
        prefix = f"{where}: " if where else ""
        raise UserError(f"{prefix}{key} = {value if shown is None else shown!r}: {problem}")


def _check_tree(value: Any, rng: Range, key: str, where: str) -> None:
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_tree(item, rng, f"{key}[{index}]", where)
    elif isinstance(value, dict):
        for name, item in value.items():
            _check_tree(item, rng, f"{key}.{name}", where)
    elif value is not None and not isinstance(value, bool):
        _check_value(value, rng, key, where)


def check_ranges(config: Any, where: str = "", prefix: str = "") -> None:
    """Every field of the dataclass tree ``config`` within its declared range (and finite,
    and within 64 bits): for a tree built or changed in code, which :func:`load_config`
    did not see. Raises a UserError naming the first field that is not."""
    ranges = _ranges(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        key = f"{prefix}{_key(field.name)}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, where, f"{key}.")
        else:
            _check_tree(value, ranges[_key(field.name)], key, where)


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


def _unknown(key: str, value: Any, root: type, where: str) -> UserError:
    """The error of an unknown key, naming the closest valid ones (``key_suggestions``); a
    table given under an unknown name is named by its first key (``optim.lr``, not ``optim``),
    which is what the closest valid key is found for."""
    while isinstance(value, dict) and value:
        name, value = next(iter(value.items()))
        key = f"{key}.{name}"
    close = key_suggestions(key, root)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UserError(f"{where}: unknown config key {key}{hint}")


def _words(key: str) -> set[str]:
    return {word for word in key.replace(".", "_").split("_") if word}


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def key_suggestions(key: str, root: type, limit: int = 2) -> list[str]:
    """The valid dotted keys of ``root`` closest to the unknown ``key``, best first (at most
    ``limit``; none when nothing is close).

    Whole dotted names are compared, not their last part alone: a candidate scores by how
    close its last part is to the key's (difflib's ratio), how many words (split at ``.`` and
    ``_``) the two share, and how close their sections are. A root class may list other
    toolkits' names in ``KEY_SYNONYMS`` (``{"learning_rate": ("lr",)}``): a key whose last part
    is one scores its targets first, in the section given when it has one, so
    ``optimizer.learning_rate`` gives ``optimizer.lr`` rather than the similarly spelled
    ``optimizer.min_lr``."""
    section, _, leaf = key.rpartition(".")
    words = _words(key)
    synonyms = getattr(root, "KEY_SYNONYMS", {}).get(leaf, ())
    scored = []
    for candidate in _all_keys(root):
        c_section, _, c_leaf = candidate.rpartition(".")
        c_words = _words(candidate)
        score = (0.5 * _similarity(leaf, c_leaf)
                 + 0.3 * len(words & c_words) / len(words | c_words)
                 + 0.2 * (_similarity(section, c_section) if section else 0.0))
        if c_leaf in synonyms:
            score += 1.0
        scored.append((score, candidate))
    scored.sort(key=lambda item: -item[0])
    if not scored or scored[0][0] < 0.5:
        return []
    best = scored[0][0]
    # ties (batch_size: the global and the micro batch) are all named, near-misses are not
    return [candidate for score, candidate in scored[:limit] if score >= best - 0.05]


def _coerce(value: Any, hint: Any, key: str, where: str, rng: Range = _ANY) -> Any:
    """``value`` as the declared type ``hint`` and within ``rng`` (for a list or table: each
    item), or a UserError naming the field."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key, where, rng)
            except UserError as err:
                errors.append(err)
        raise errors[0]
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise UserError(f"{where}: {key} = {value!r}: expected a list")
        item = args[0] if args else Any
        return [_coerce(v, item, f"{key}[{i}]", where, rng) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: {key} = {value!r}: expected a table")
        return {str(k): _coerce(v, args[1], f"{key}.{k}", where, rng)
                for k, v in value.items()}
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{where}: {key} = {value!r}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            coerced = value
        elif isinstance(value, float) and value.is_integer():
            coerced = int(value)  # 1e6 in TOML or on the command line
        else:
            raise UserError(f"{where}: {key} = {value!r}: expected an integer")
    elif hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise UserError(f"{where}: {key} = {value!r}: expected a number")
        try:
            coerced = float(value)
        except OverflowError:  # an integer beyond any float
            raise UserError(f"{where}: {key} = {value!r}: not a finite number; must be "
                            f"{rng.describe()}") from None
    elif hint is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: {key} = {value!r}: expected a string")
        coerced = value
    else:
        raise TypeError(f"config field {key}: unsupported type {hint!r}")
    _check_value(coerced, rng, key, where, shown=value)
    return coerced


def _merge(instance: Any, table: dict, root: type, where: str, prefix: str = "") -> None:
    hints = _hints(type(instance))
    ranges = _ranges(type(instance))
    for name, value in table.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise _unknown(key, value, root, where)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"{where}: {key} is a section; give it as [{key}] or "
                                f"{key}.FIELD=VALUE")
            _merge(getattr(instance, name), value, root, where, f"{key}.")
        else:
            setattr(instance, _attribute(name), _coerce(value, hint, key, where, ranges[name]))


def _apply_renames(table: dict, root: type, where: str) -> dict:
    """``table`` with the keys a root class lists in ``RENAMED_KEYS`` (``{old dotted key: new
    dotted key}``) moved to their new names, so recipes and checkpoints written before a rename
    still load; one line on stderr says so. Both names given at once is an error."""
    for old, new in getattr(root, "RENAMED_KEYS", {}).items():
        *old_path, old_name = old.split(".")
        parent = table
        for part in old_path:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or old_name not in parent:
            continue
        value = parent.pop(old_name)
        *new_path, new_name = new.split(".")
        target = table
        for part in new_path:
            target = target.setdefault(part, {})
        if new_name in target:
            raise UserError(f"{where}: {old} and {new} both given; {old} is the old name of "
                            f"{new}, keep only {new}")
        target[new_name] = value
        print(f"{where}: {old} is now called {new}; read as {new}", file=sys.stderr)
    return table


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


def _table_entry(config: Any, parts: list[str], value: Any) -> tuple[list[str], Any]:
    """An override of one entry of a table field (``data.weights.wiki=0.3``) as the whole
    table with that entry set: the entries already there (the recipe's, an earlier
    override's) stay, where merging the entry alone would replace the table with it. Any
    other override is returned as it is (``data.weights={wiki=0.3}`` replaces the table)."""
    instance = config
    for index, part in enumerate(parts[:-1]):
        hint = _hints(type(instance)).get(part)
        if hint is None:
            break  # unknown: the merge names it
        if dataclasses.is_dataclass(hint):
            instance = getattr(instance, _attribute(part))
            continue
        current = getattr(instance, _attribute(part))
        if typing.get_origin(hint) is not dict or not isinstance(current, dict):
            break
        table = copy.deepcopy(current)
        cursor = table
        for name in parts[index + 1:-1]:
            child = cursor.get(name)
            cursor[name] = child = child if isinstance(child, dict) else {}
            cursor = child
        cursor[parts[-1]] = value
        return parts[:index + 1], table
    return parts, value


def load_config(cls: type[C], path: str | Path | None = None,
                overrides: list[str] | None = None) -> C:
    """An instance of the dataclass tree ``cls``: defaults <- TOML file <- overrides.

    Raises:
        UserError: unreadable/invalid TOML (with its line), an unknown key (with the closest
            valid one), a value of the wrong type or out of its field's range (naming the
            field, the range and where the value came from).
    """
    config = cls()
    if path is not None:
        path = Path(path)
        try:
            with open_regular(path, "config file") as fh:  # a FIFO would block the read
                data = fh.read()
            table = tomllib.loads(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            line = data[:err.start].count(b"\n") + 1
            raise UserError(f"{path}:{line}: not UTF-8 text (byte {data[err.start]:#04x}); "
                            "TOML files are UTF-8: re-save it as UTF-8") from None
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{path}: invalid TOML: {err}") from None
        _merge(config, _apply_renames(table, cls, str(path)), cls, str(path))
    for text in overrides or []:
        parts, value = _parse_override(text)
        parts, value = _table_entry(config, parts, value)
        nested: dict = {}
        cursor = nested
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        where = f"override {text!r}"
        _merge(config, _apply_renames(nested, cls, where), cls, where)
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
    _merge(config, _apply_renames(table, cls, where), cls, where)
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
def _written_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` as written under each field of ``cls`` (and its bases)."""
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


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literals written under each field, each ending
    with the field's declared range (``Allowed: > 0.``)."""
    docs = dict(_written_docs(cls))
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            rng, key = field_range(field), _key(field.name)
            if rng is not None and key in docs:
                docs[key] += f" Allowed: {rng.describe()}."
    return docs


def _type_name(hint: Any) -> str:
    """``int``, ``list[int]``, ``dict[str, float]``, ``str | None``: a type as a user reads it."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def describe_keys(cls: type, config: Any = None, prefix: str = "") -> list[dict[str, Any]]:
    """Every key of the dataclass tree ``cls`` in declaration order, as ``{"key": dotted name,
    "section", "type", "default" (as TOML writes it; None: unset), "allowed" (the declared
    range, or ""), "doc" (the docstring written under the field; "" when it has none)}``,
    plus ``"value"`` (written as the default is) when an instance ``config`` is given: what
    ``--doc`` prints, made from the tree itself so that it cannot drift from it."""
    rows: list[dict[str, Any]] = []
    hints = typing.get_type_hints(cls)
    docs = _written_docs(cls)
    defaults = cls()
    for field in dataclasses.fields(cls):
        key, hint = _key(field.name), hints[field.name]
        if dataclasses.is_dataclass(hint):
            child = getattr(config, field.name) if config is not None else None
            rows += describe_keys(hint, child, f"{prefix}{key}.")
            continue
        rng = field_range(field)
        row = {"key": f"{prefix}{key}", "section": prefix.rstrip("."),
               "type": "path" if PATH in field.metadata else _type_name(hint),
               "default": _shown(getattr(defaults, field.name)),
               "allowed": rng.describe() if rng is not None else "",
               "doc": docs.get(key, "")}
        if config is not None:
            row["value"] = _shown(getattr(config, field.name))
        rows.append(row)
    return rows


def _shown(value: Any) -> str | None:
    return None if value is None else _toml_value(value)


# -- frozen configs: a settled run's config is read-only ---------------------------------
_FROZEN: dict[type, type] = {}


def freeze(cfg):
    """``cfg`` (a tree of config dataclasses) made read-only in place: assigning any field
    of any section raises ``dataclasses.FrozenInstanceError`` naming it. Returns ``cfg``."""
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            freeze(value)
    cls = type(cfg)
    if cls not in _FROZEN.values():
        if cls not in _FROZEN:
            _FROZEN[cls] = type(cls.__name__, (cls,), {
                "__setattr__": _refuse, "__delattr__": _refuse, "__reduce_ex__": _reduce,
                "__eq__": _equal, "__hash__": None, "__new__": _new_plain,
                "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        object.__setattr__(cfg, "__class__", _FROZEN[cls])
    return cfg


def thawed_copy(cfg):
    """A deep copy of ``cfg`` that may be changed (of a frozen config or a plain one)."""
    cfg = copy.deepcopy(cfg)
    _thaw(cfg)
    return cfg


def _thaw(cfg) -> None:
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _thaw(value)
    if type(cfg) in _FROZEN.values():
        object.__setattr__(cfg, "__class__", type(cfg).__mro__[1])


def _reduce(self, protocol):
    """Pickles and copies of a frozen section: rebuilt from its plain class (a pickle names
    the class by module and name, which is the plain one), then frozen again."""
    return _rebuild_frozen, (type(self).__mro__[1], dict(self.__dict__))


def _rebuild_frozen(cls, state: dict):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return freeze(obj)


def _new_plain(cls, *args, **kwargs):
    """``type(frozen)(...)`` (``dataclasses.replace``, ``config_from_dict(type(cfg), ...)``)
    builds a plain, changeable instance of the config's own class."""
    return cls.__mro__[1](*args, **kwargs)


def _equal(self, other) -> bool:
    """Equal to a plain or frozen config of the same class with equal fields (the
    dataclass's own ``__eq__`` wants the very same class)."""
    plain = type(self).__mro__[1]
    if not isinstance(other, plain):
        return NotImplemented
    return all(getattr(self, f.name) == getattr(other, f.name)
               for f in dataclasses.fields(plain))


def _refuse(self, name, *args):
    raise dataclasses.FrozenInstanceError(
        f"cannot assign {type(self).__name__}.{name}: this config is frozen (a settled run's); "
        "change a thawed_copy of it")
