"""``trainer config``: the resolved config as TOML or JSON, and every key's documentation,
both made from the typed tree in ``config.py`` (``config_loader.describe_keys``), so that
what is printed cannot drift from what is read: a new field appears with its type, default,
range and docstring the moment it is declared."""

from __future__ import annotations

import json
import textwrap
import tomllib

from bloomline.common.config_loader import describe_keys, to_toml
from bloomline.trainer.config import Config

__all__ = ["config_json", "config_toml", "key_docs", "key_rows"]

_WIDTH = 96  # the doc lines' wrap


def config_toml(cfg: Config) -> str:
    """The config as TOML that ``--config`` reads back to the same run."""
    return to_toml(cfg)


def config_json(cfg: Config) -> str:
    """The config as one JSON object of sections, under the keys a recipe writes
    (``checkpoint.async``, not the attribute ``async_``)."""
    return json.dumps(tomllib.loads(to_toml(cfg)), indent=1) + "\n"


def key_rows(cfg: Config | None = None) -> list[dict]:
    """Every key of the trainer's config (``describe_keys``), with its ``value`` in ``cfg``
    when a config is given."""
    return describe_keys(Config, cfg)


def key_docs(cfg: Config | None = None, as_json: bool = False) -> str:
    """Every key grouped by section, a header line each (``key: type = default (allowed)``,
    with ``cfg``: ``key: type = value (default D; allowed)`` where the value differs) and its
    docstring below, indented; or the rows as a JSON list."""
    rows = key_rows(cfg)
    if as_json:
        return json.dumps(rows, indent=1)
    lines: list[str] = []
    section = None
    for row in rows:
        if row["section"] != section:
            section = row["section"]
            lines += ["", f"[{section}]"] if lines else [f"[{section}]"]
        notes = [row["allowed"]] if row["allowed"] else []
        shown = _unset(row["default"])
        if cfg is not None and row["value"] != row["default"]:
            notes.insert(0, f"default {shown}")
            shown = _unset(row["value"])
        lines.append(f"{row['key']}: {row['type']} = {shown}"
                     + (f"  ({'; '.join(notes)})" if notes else ""))
        lines += textwrap.wrap(row["doc"], _WIDTH, initial_indent="    ",
                               subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)


def _unset(value: str | None) -> str:
    return "(unset)" if value is None else value
