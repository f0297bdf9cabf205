"""Allowed values declared with a config field (``ranged``) and checked by the loader for
every value merged in, and by ``check_ranges`` for a tree built in code."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bloomline.common.config_loader import (
    Range,
    check_ranges,
    config_from_dict,
    field_docs,
    load_config,
    ranged,
)
from bloomline.common.errors import UserError


@dataclasses.dataclass
class Inner:
    rate: float = ranged(0.5, ge=0, lt=1)
    """A fraction."""
    steps: int = ranged(10, ge=1, le=2**40)
    """How many."""
    mode: str = ranged("a", choices=("a", "b"))
    """Which."""
    limit: float = ranged(1.0, gt=0, nonfinite=True)
    """inf: none."""
    weights: dict[str, float] = ranged(default_factory=dict, ge=0)
    """Per name."""
    spans: list[list[int]] = ranged(default_factory=list, ge=0)
    """Pairs."""
    plain: float = 1.0
    """No range declared: finite floats only."""
    count: int = 0
    """No range declared: 64-bit integers only."""


@dataclasses.dataclass
class Tree:
    inner: Inner = dataclasses.field(default_factory=Inner)


@pytest.mark.parametrize("override, message", [
    ("inner.rate=1.0", "inner.rate = 1.0: must be in [0, 1)"),
    ("inner.rate=-1e-9", "inner.rate = -1e-09: must be in [0, 1)"),
    ("inner.rate=nan", "inner.rate = nan: not a finite number; must be in [0, 1)"),
    ("inner.steps=0", "inner.steps = 0: must be in [1, 2**40]"),
    ("inner.steps=1e30", "inner.steps = 1e+30: must be in [1, 2**40]"),
    ("inner.mode='c'", "inner.mode = 'c': expected one of a, b"),
    ("inner.limit=0", "inner.limit = 0: must be > 0"),
    ("inner.limit=-inf", "inner.limit = -inf: must be > 0"),
    ("inner.weights={x=-1}", "inner.weights.x = -1: must be >= 0"),
    ("inner.spans=[[0, -2]]", "inner.spans[0][1] = -2: must be >= 0"),
    ("inner.plain=inf", "inner.plain = inf: not a finite number"),
    ("inner.count=9223372036854775808", "inner.count = 9223372036854775808: does not fit in a "
                                        "64-bit integer"),
])
def test_out_of_range_values_are_one_line_naming_field_value_range_and_origin(override,
                                                                             message):
    """Bug: a value outside its declared range (or nan/inf, or an integer beyond 64 bits)
    accepted, or refused without naming the override it came from and the allowed range."""
    with pytest.raises(UserError) as refused:
        load_config(Tree, None, [override])
    assert str(refused.value) == f"override {override!r}: {message}"


def test_boundaries_inside_the_range_are_accepted():
    """Bug: an off-by-one in the comparisons refusing the bound itself (ge/le) or accepting it
    (gt/lt); a field that allows inf refusing it."""
    tree = load_config(Tree, None, ["inner.rate=0", f"inner.rate={math.nextafter(1, 0)!r}",
                                    "inner.steps=1099511627776", "inner.mode='b'",
                                    "inner.limit=inf", "inner.weights={x=0}",
                                    "inner.spans=[[0, 1]]"])
    assert tree.inner.steps == 2**40 and tree.inner.limit == math.inf
    check_ranges(tree)


def test_a_file_and_a_dict_name_their_origin(tmp_path):
    """Bug: a bad value in a file (or a checkpoint's stored config) reported without where."""
    path = tmp_path / "c.toml"
    path.write_text("[inner]\nsteps = -3\n")
    with pytest.raises(UserError, match=r"c.toml: inner.steps = -3: must be in \[1, 2\*\*40\]$"):
        load_config(Tree, path)
    with pytest.raises(UserError, match=r"^saved.toml: inner.mode = 'z': expected one of a, b$"):
        config_from_dict(Tree, {"inner": {"mode": "z"}}, "saved.toml")


def test_check_ranges_covers_values_set_in_code():
    """Bug: a tree changed in code after loading (or built without the loader) never checked."""
    tree = Tree()
    check_ranges(tree)
    tree.inner.weights = {"x": float("nan")}
    with pytest.raises(UserError, match=r"^inner.weights.x = nan: not a finite number"):
        check_ranges(tree)


def test_help_text_ends_with_the_range():
    """Bug: --help-like output (field_docs) not saying which values a field takes."""
    docs = field_docs(Inner)
    assert docs["rate"] == "A fraction. Allowed: in [0, 1)."
    assert docs["mode"] == "Which. Allowed: one of a, b."
    assert docs["plain"] == "No range declared: finite floats only."


def test_a_range_takes_one_bound_per_side_or_choices():
    """Bug: ge and gt both given (which one holds?) silently accepted in a declaration."""
    with pytest.raises(TypeError):
        Range(ge=0, gt=0)
    with pytest.raises(TypeError):
        Range(choices=("a",), le=1)
