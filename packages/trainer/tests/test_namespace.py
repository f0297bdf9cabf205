"""The three distributions share the ``bloomline`` namespace package."""

from __future__ import annotations

import importlib


def test_all_three_distributions_import_under_one_namespace():
    """Catches: a ``bloomline/__init__.py`` added to one distribution, which hides the other
    two (a regular package shadows the namespace)."""
    import bloomline

    assert getattr(bloomline, "__file__", None) is None  # a namespace package has no file
    for name in ("common", "dataprep", "trainer"):
        assert importlib.import_module(f"bloomline.{name}").__name__ == f"bloomline.{name}"
