"""Config keys renamed between releases still load from recipes, overrides and saved configs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from bloomline.common.config_loader import config_from_dict, load_config
from bloomline.common.errors import UserError


@dataclass
class _Monitor:
    stats_interval: int = 100


@dataclass
class _Root:
    monitor: _Monitor = field(default_factory=_Monitor)

    RENAMED_KEYS = {"monitor.old_interval": "monitor.stats_interval"}


def test_an_old_key_in_a_saved_config_loads_under_its_new_name(capsys):
    """Catches: a checkpoint written before a rename failing to resume, evaluate or export with
    'unknown config key' (its config.toml holds the old name)."""
    config = config_from_dict(_Root, {"monitor": {"old_interval": 7}}, "ckpt/config.toml")
    assert config.monitor.stats_interval == 7
    assert "monitor.old_interval is now called monitor.stats_interval" in capsys.readouterr().err


def test_an_old_key_in_a_recipe_or_override_loads(tmp_path):
    """Catches: the rename applied to one input path only (the recipe but not the command line)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[monitor]\nold_interval = 3\n")
    assert load_config(_Root, recipe).monitor.stats_interval == 3
    assert load_config(_Root, None, ["monitor.old_interval=5"]).monitor.stats_interval == 5


def test_old_and_new_name_together_are_refused():
    """Catches: one of two contradicting values silently winning."""
    with pytest.raises(UserError, match="both given"):
        config_from_dict(_Root, {"monitor": {"old_interval": 1, "stats_interval": 2}})
