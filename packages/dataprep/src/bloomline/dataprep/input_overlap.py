"""INPUT arguments that name the same file twice: each file is read once, with a line saying so.

``dataprep tokenize raw/multi raw/multi/seeds.jsonl`` names ``seeds.jsonl`` twice (the folder
holds it); so do ``x.jsonl ./x.jsonl``, a symbolic link beside its target and overlapping
globs. Tokenizing such a file twice doubles its documents in the corpus without a word, which
is never what a user meant: upsampling a source is what blend weights are for, and a
repeated file is almost always an overlap of arguments. So the file is read once, at its
first place in argument order (the output order is the arguments' order), and each
overlap is named in one ``warning:`` line. Files are the same when the filesystem says so
(device and inode), whatever the path, link or ``./`` spelling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bloomline.dataprep.formats.base import Source

__all__ = ["drop_repeated_sources"]


@dataclass(frozen=True)
class _Given:
    """Where a source came from: the INPUT argument, and whether it was a folder or glob."""

    argument: str
    expanded: bool  # a folder or glob (it holds the file) rather than the file itself


def drop_repeated_sources(groups: list[tuple[str, bool, list[Source]]]
                          ) -> tuple[list[Source], list[str]]:
    """The sources of every argument, each file once (its first place), and one warning line
    per argument that repeated files of earlier ones.

    ``groups``: per INPUT argument in order, (the argument, whether it is a folder or glob,
    its sources).
    """
    seen: dict[tuple[int, int], tuple[Source, _Given]] = {}
    kept: list[Source] = []
    notes: list[str] = []
    for argument, expanded, sources in groups:
        given = _Given(argument, expanded)
        repeats: list[tuple[Source, Source, _Given]] = []
        for source in sources:
            identity = _identity(source.path)
            if identity in seen:
                first, first_given = seen[identity]
                repeats.append((source, first, first_given))
                continue
            seen[identity] = (source, given)
            kept.append(source)
        if repeats:
            notes.append(_note(given, repeats, len(sources)))
    return kept, notes


def _identity(path: str) -> tuple[int, int]:
    status = os.stat(path)  # follows links: a link and its target are one file
    return status.st_dev, status.st_ino


def _note(given: _Given, repeats: list[tuple[Source, Source, _Given]], files: int) -> str:
    source, first, first_given = repeats[0]
    if len(repeats) > 1:
        where = ", ".join(sorted({g.argument for _, _, g in repeats}))
        which = f"all {files:,}" if len(repeats) == files else f"{len(repeats):,}"
        return (f"warning: {given.argument}: {which} of its files were given before (in "
                f"{where}), e.g. {source.path}; each is read once")
    if source.path != first.path:  # ./x and x, a link and its target, ../a/x
        link = " (a link to it)" if os.path.islink(source.path) else ""
        return f"warning: {source.path}: the same file as {first.path}{link}; read once"
    if given.expanded and not first_given.expanded:  # the folder after the file
        return f"warning: {first.path}: also inside {given.argument}; read once"
    if first_given.expanded:  # the file (or a folder inside it) after the folder
        return f"warning: {source.path}: also inside {first_given.argument}; read once"
    return f"warning: {source.path}: given twice; read once"
