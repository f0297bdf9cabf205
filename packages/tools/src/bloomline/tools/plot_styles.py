"""Line styles that keep curves on the same path visible: ``inspect-data plot`` draws datasets
of one weight (their shares converge on the same value) and datasets of identical length
distributions on top of each other, where the last one drawn would hide the others.

Lines of such a group share their path in turns: each gets a dash pattern whose dashes fall
into the others' gaps (so every colour shows along the whole line) and a marker of its own,
and the legend says that they alternate.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["MARKERS", "alternating_dashes", "legend_handle_length", "overlap_groups",
           "shared_path_style"]

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASH = 6.0  # points of one dash
_MARK_STEP = 0.1  # of the axes' diagonal between two markers of a line


def alternating_dashes(position: int, count: int) -> str | tuple:
    """The linestyle of line ``position`` of ``count`` on one path: solid when alone, else
    a dash then a gap for the other ``count - 1``, shifted by ``position`` dashes."""
    if count < 2:
        return "-"
    return (position * _DASH, (_DASH, (count - 1) * _DASH))


def overlap_groups(keys: Sequence[Hashable]) -> list[tuple[int, int]]:
    """Per item: (its place among the items of the same key, how many have that key)."""
    places: list[tuple[int, int]] = []
    for number, key in enumerate(keys):
        same = [k for k in keys if k == key]
        places.append((sum(1 for k in keys[:number] if k == key), len(same)))
    return places


def shared_path_style(number: int, place: tuple[int, int]) -> dict:
    """matplotlib line keywords for item ``number`` at ``place`` (:func:`overlap_groups`):
    alternating dashes and a marker of its own, staggered along the line, when not alone."""
    position, count = place
    if count < 2:
        return {"linestyle": "-"}
    # markevery as floats: evenly spaced on the screen, also on a log axis
    return {"linestyle": alternating_dashes(position, count),
            "marker": MARKERS[number % len(MARKERS)], "markersize": 4,
            "markevery": (_MARK_STEP * position / count, _MARK_STEP)}


def legend_handle_length(places: list[tuple[int, int]]) -> float:
    """A legend handle long enough to show a dash of every line of the largest group."""
    return max(2.0, 1.5 * max((count for _, count in places), default=1))
