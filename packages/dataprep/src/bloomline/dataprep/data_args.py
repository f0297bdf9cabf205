"""Megatron-LM's data arguments: ``--data-path``, ``--data-args-path`` and
``--per-split-data-args-path``.

A Megatron user names the token files of a run by their prefixes, anywhere on disk, in one of
three forms (megatron-core's ``get_blend_from_list`` and Megatron-LM's
``get_blend_and_blend_per_split``):

* ``--data-path PREFIX [PREFIX ...]``: no weights; each dataset once, in proportion to size;
* ``--data-path W1 PREFIX1 W2 PREFIX2 ...``: a weighted blend (weights normalized to sum 1);
* ``--data-args-path FILE``: a file holding the same words (a list too long for a command line);
* ``--per-split-data-args-path FILE.json``: ``{"train": [...], "valid": [...], "test": [...]}``,
  a blend per split, each in one of the forms above (a list or one string).

With the first three every dataset is cut into train/valid/test by ``--split``, as a corpus
folder is (megatron-core's ``blend``). With a per-split file each listed dataset is used whole
by its split (megatron-core's ``blend_per_split``: its split matrix is ``(0, 1)`` for that
split alone), and a split is present when it lists datasets ("train" is required).

Words may come as several arguments or as one string with spaces (what users paste): both are
split on whitespace. The form is decided by the first word: a number starts the weighted form
(then weights and prefixes must alternate, each weight a number >= 0), anything else the plain
list of prefixes. Stricter than megatron-core, which reads an odd count as prefixes and a
number where a prefix goes as a file name; each of those is an error here, naming the item.

Names: a dataset is named by its file stem (``corpus/code`` -> ``code``), the name every report,
``--weight``/``data.weights`` and cache entry uses. Stems that two different prefixes share get
their parent folders until they differ (``a/train`` and ``b/train`` -> ``a/train``, ``b/train``),
the same for every split of a per-split file. A prefix given twice in one blend is refused.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.errors import SettingError, UserError
from bloomline.dataprep.gpt_index import DEFAULT_SPLIT, SPLIT_NAMES
from bloomline.dataprep.setting_names import setting_error

__all__ = ["DataArgs", "DataSource", "absolute_data_path", "check_choice",
           "choose_source", "data_args", "dataset_names", "expand_data_path_argv",
           "is_weighted", "parse_data_path"]

# a weight as Megatron's users write one: 0.3, 30, .5, 1e-3 (not nan, inf or a file name)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class DataSource:
    """One dataset of a blend: its name, its ``PREFIX`` (of PREFIX.bin/.idx), its weight
    (None: unweighted, by size)."""

    name: str
    prefix: str
    weight: float | None


@dataclass(frozen=True)
class DataArgs:
    """The datasets Megatron's arguments name: one blend cut by ``--split`` (``blend``), or a
    blend per split, each dataset used whole (``per_split``); never both."""

    argument: str  # the neutral setting that gave them: data_path, data_args_path, ...
    text: str  # as the user gave them, for reports
    blend: tuple[DataSource, ...] = ()
    per_split: dict[str, tuple[DataSource, ...]] | None = None

    @property
    def weighted(self) -> bool:
        """Whether the weights come with the prefixes (then no other weights may be given)."""
        blends = self.per_split.values() if self.per_split is not None else [self.blend]
        return any(source.weight is not None for blend in blends for source in blend)

    def sources(self) -> dict[str, str]:
        """name -> prefix of every dataset, in the order given (train's first)."""
        blends = self.per_split.values() if self.per_split is not None else [self.blend]
        return {source.name: source.prefix for blend in blends for source in blend}

    def default_cache_dir(self) -> Path:
        """``.index`` beside the first prefix: Megatron keeps its indices beside the data
        (``--data-cache-path`` to put them elsewhere)."""
        return Path(next(iter(self.sources().values()))).parent / ".index"



def choose_source(corpus: str | None, split: str | None, data_path: Sequence[str] | str = (),
                  data_args_path: str | None = None, per_split_data_args_path: str | None = None
                  ) -> tuple[str | DataArgs, str]:
    """What a command reads: its corpus folder or Megatron's data arguments (exactly one of
    them), and the split to cut them by (``split``, default 969,30,1; a per-split file has
    none, and a split given beside it is refused, as megatron-core does).

    Raises:
        SettingError: none or two given, or what :func:`data_args` raises.
    """
    check_choice(corpus, split, data_path, data_args_path, per_split_data_args_path)
    if not corpus:
        return (data_args(data_path, data_args_path, per_split_data_args_path),
                split or DEFAULT_SPLIT)
    return corpus, split or DEFAULT_SPLIT


def check_choice(corpus: str | None, split: str | None, data_path: Sequence[str] | str = (),
                 data_args_path: str | None = None, per_split_data_args_path: str | None = None,
                 weights: bool = False) -> None:
    """The rules of :func:`choose_source` that need no file read: one source given, no split
    (and no ``weights``, when given elsewhere) beside a per-split file, no weights given twice,
    ``--data-path``'s words well formed.

    Raises:
        SettingError: naming the settings at fault.
    """
    given = _given(data_path, data_args_path, per_split_data_args_path)
    if corpus and given:
        raise setting_error("corpus", "{setting} {value} and {" + given[0] + "}: give one of "
                            "them (the folder means every NAME.bin/.idx in it)", value=corpus)
    if not corpus and not given:
        raise setting_error("corpus", "{setting} not given: give a folder of NAME.bin/.idx, or "
                            "the datasets' prefixes with {data_path}, {data_args_path} or "
                            "{per_split_data_args_path}")
    if len(given) > 1:
        raise setting_error(given[0], "{setting} and {" + given[1] + "}: give one of them")
    if per_split_data_args_path and split:
        raise setting_error("split", "{setting} {value} and {per_split_data_args_path}: each "
                            "split's datasets are used whole; leave out {setting}", value=split)
    if data_path:
        parse_data_path(data_path)
    if weights and ((data_path and is_weighted(data_path)) or per_split_data_args_path):
        raise setting_error("weights", "{setting} and {" + given[0] + "}: give the weights in "
                            "one place (W1 PREFIX1 W2 PREFIX2 ...)")


def _given(data_path, data_args_path, per_split_data_args_path) -> list[str]:
    return [name for name, value in (("data_path", data_path), ("data_args_path", data_args_path),
                                     ("per_split_data_args_path", per_split_data_args_path))
            if value]


def data_args(data_path: Sequence[str] | str | None = None, data_args_path: str | None = None,
              per_split_data_args_path: str | None = None) -> DataArgs | None:
    """The datasets of whichever of the three arguments is given (None: none is).

    Raises:
        SettingError: two of them given, a bad item (named by position), a missing token file,
            a file that cannot be read.
    """
    given = _given(data_path, data_args_path, per_split_data_args_path)
    if len(given) > 1:
        raise setting_error(given[0], "{setting} and {" + given[1] + "}: give one of them")
    if not given:
        return None
    if data_path:
        words = _words(data_path)
        return DataArgs("data_path", " ".join(words),
                        _sources(_parse(words, _Where("data_path"))))
    if data_args_path:
        where = _Where("data_args_path", data_args_path)
        words = _words(_read(data_args_path, where))
        return DataArgs("data_args_path", data_args_path, _sources(_parse(words, where)))
    return _per_split(per_split_data_args_path)


def parse_data_path(data_path: Sequence[str] | str, setting: str = "data_path"
                    ) -> list[tuple[str, float | None]]:
    """``(prefix, weight or None)`` of ``--data-path``'s words, checked as the module says
    (the files are not opened)."""
    return _parse(_words(data_path), _Where(setting), check_files=False)


def is_weighted(data_path: Sequence[str] | str) -> bool:
    """Whether ``--data-path``'s words are the weighted form (its first word a number)."""
    words = _words(data_path)
    return len(words) > 1 and bool(_NUMBER.fullmatch(words[0]))


def absolute_data_path(data_path: Sequence[str] | str, base: str | os.PathLike) -> list[str]:
    """The words with every prefix made absolute against ``base`` (weights kept): a saved
    config that works from any folder. Words it cannot parse are kept as they are (the
    settle-time check names them)."""
    words = _words(data_path)
    try:
        parsed = _parse(words, _Where("data_path"), check_files=False)
    except UserError:
        return list(words)
    out: list[str] = []
    for prefix, weight in parsed:
        if weight is not None:
            out.append(words[len(out)])
        out.append(os.path.normpath(Path(base) / Path(prefix).expanduser()))
    return out


def expand_data_path_argv(argv: list[str], options: Sequence[str] = ("--data-path",)
                          ) -> list[str]:
    """``--data-path W1 P1 W2 P2`` (Megatron's argparse ``nargs='*'``) as the repeated option
    click reads: ``--data-path W1 --data-path P1 ...`` (also from ``--data-path=W1 P1 ...``).
    The words run to the next option (a word starting with ``--``, or ``-`` and a letter)."""
    out: list[str] = []
    option = None
    for word in argv:
        name, equals, value = word.partition("=")
        if equals and name in options:  # --data-path=W1 P1 W2 ...: the rest follows it
            option = name
            out.extend((option, value))
            continue
        if word.startswith("--") or re.match(r"-[A-Za-z]", word):
            option = word if word in options else None
            out.append(word)
            if option is not None:
                out.pop()
            continue
        out.extend((option, word) if option is not None else (word,))
    return out


@dataclass(frozen=True)
class _Where:
    """Where items come from, for the error line: the setting, the file and the JSON key."""

    setting: str
    file: str | None = None
    key: str | None = None

    def error(self, template: str, /, **values: object) -> SettingError:
        head = "{setting}" + (" {file}" if self.file else "") + (
            " {key!r}" if self.key else "")
        return setting_error(self.setting, head + ": " + template, file=self.file,
                             key=self.key, **values)


def _words(value: Sequence[str] | str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    return [word for item in items for word in str(item).split()]


def _read(path: str, where: _Where) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise where.error("cannot read it ({problem})",
                          problem=getattr(err, "strerror", None) or err) from None


def _parse(words: list[str], where: _Where, check_files: bool = True
           ) -> list[tuple[str, float | None]]:
    if not words:
        raise where.error("no datasets; give PREFIX [PREFIX ...] or W1 PREFIX1 W2 PREFIX2 ...")
    if len(words) == 1 or not _NUMBER.fullmatch(words[0]):
        pairs = [(word, None) for word in words]
        for position, word in enumerate(words, 1):
            if _NUMBER.fullmatch(word) and not Path(word + ".idx").exists():
                raise where.error("item {position} {word!r} is a number among prefixes; give "
                                  "a weight before every prefix (W1 PREFIX1 W2 PREFIX2 ...) or "
                                  "none", position=position, word=word)
    else:
        if len(words) % 2:
            raise where.error("{count} items, an odd count: the weighted form is pairs of a "
                              "weight and a prefix (W1 PREFIX1 W2 PREFIX2 ...)",
                              count=len(words))
        pairs = []
        for position in range(0, len(words), 2):
            weight, prefix = words[position], words[position + 1]
            if not _NUMBER.fullmatch(weight):
                raise where.error("item {position} {word!r}: not a number; the weighted form "
                                  "is W1 PREFIX1 W2 PREFIX2 ..., a weight before each prefix",
                                  position=position + 1, word=weight)
            if _NUMBER.fullmatch(prefix):
                raise where.error("item {position} {word!r} is a number where a prefix goes "
                                  "(W1 PREFIX1 W2 PREFIX2 ...)", position=position + 2,
                                  word=prefix)
            pairs.append((prefix, _weight(weight, position + 1, where)))
        if not any(weight > 0 for _, weight in pairs):
            raise where.error("the weights must not all be zero")
    _check_once(pairs, where)
    if check_files:
        for position, (prefix, _) in enumerate(pairs):
            _check_files(prefix, where, position)
    return pairs


def _weight(word: str, position: int, where: _Where) -> float:
    weight = float(word)
    if not (math.isfinite(weight) and weight >= 0):
        raise where.error("item {position} {word!r}: a weight must be a finite number >= 0 "
                          "(0 leaves the dataset out)", position=position, word=word)
    return weight


def _check_once(pairs: list[tuple[str, float | None]], where: _Where) -> None:
    seen: dict[str, int] = {}
    for position, (prefix, _) in enumerate(pairs, 1):
        key = os.path.normpath(os.path.abspath(prefix))
        if key in seen:
            raise where.error("{prefix} is given twice (datasets {first} and {second}); give "
                              "it once (with the sum of its weights)", prefix=prefix,
                              first=seen[key], second=position)
        seen[key] = position


def _check_files(prefix: str, where: _Where, position: int) -> None:
    for suffix in (".idx", ".bin"):
        if not Path(prefix + suffix).is_file():
            hint = " (a prefix names PREFIX.bin/.idx, without the suffix)" if (
                prefix.endswith((".bin", ".idx"))) else ""
            raise where.error("{prefix}: no {path}" + hint, prefix=prefix,
                              path=prefix + suffix)


def _sources(pairs: list[tuple[str, float | None]], names: dict[str, str] | None = None
             ) -> tuple[DataSource, ...]:
    names = names if names is not None else dataset_names([prefix for prefix, _ in pairs])
    return tuple(DataSource(names[os.path.abspath(prefix)], prefix, weight)
                 for prefix, weight in pairs)


def dataset_names(prefixes: Sequence[str]) -> dict[str, str]:
    """absolute prefix -> its dataset name: the file stem, with as many parent folders as it
    takes to tell apart prefixes that share a stem (deterministic: from the paths alone)."""
    absolute = list(dict.fromkeys(os.path.abspath(prefix) for prefix in prefixes))
    parts = {prefix: Path(prefix).parts for prefix in absolute}
    depth = dict.fromkeys(absolute, 1)
    while True:
        names = {prefix: "/".join(parts[prefix][-depth[prefix]:]) for prefix in absolute}
        counts = Counter(names.values())
        clashes = [prefix for prefix in absolute if counts[names[prefix]] > 1]
        if not clashes:
            return names
        for prefix in clashes:
            depth[prefix] += 1


def _per_split(path: str) -> DataArgs:
    where = _Where("per_split_data_args_path", path)
    try:
        spec = json.loads(_read(path, where))
    except ValueError as err:
        raise where.error("not JSON ({problem})", problem=str(err)) from None
    if not isinstance(spec, dict):
        raise where.error('expected a JSON object {{"train": [...], "valid": [...], '
                          '"test": [...]}}')
    unknown = sorted(set(spec) - set(SPLIT_NAMES))
    if unknown:
        raise where.error("unknown key {key!r}; the keys are train, valid and test",
                          key=unknown[0])
    if not spec.get("train"):
        raise where.error('no "train" datasets; expected {{"train": [...], "valid": [...], '
                          '"test": [...]}} (valid and test may be left out)')
    parsed: dict[str, list[tuple[str, float | None]]] = {}
    for split in SPLIT_NAMES:
        value = spec.get(split)
        if not value:  # missing, null, "" or []: no such split
            continue
        if not (isinstance(value, str) or (isinstance(value, list)
                                           and all(isinstance(v, str | int | float)
                                                   for v in value))):
            raise _Where(where.setting, path, split).error(
                "expected a list of words or one string (W1 PREFIX1 ... or PREFIX ...)")
        parsed[split] = _parse(_words(value), _Where(where.setting, path, split))
    names = dataset_names([prefix for pairs in parsed.values() for prefix, _ in pairs])
    return DataArgs("per_split_data_args_path", path, per_split={
        split: _sources(pairs, names) for split, pairs in parsed.items()})
