"""Which kind of tokenizer a ``--tokenizer`` value names, and loading it.

The kinds are in :mod:`.registry`; each says how it is recognised (:class:`~.base.Tokenizer`'s
"recognising a kind" attributes). :func:`tokenizer_kind` asks them in this order:

1. a name that is not a file of the kind (``tiktoken:NAME``, or a bare ``NAME`` that is no
   path);
2. a folder: the kind whose file it holds (``tokenizer.json``, else ``tokenizer.model``);
3. a file's suffix (``.json``, ``.model``, ``.tiktoken``);
4. a file's first bytes (a ``tokenizer.json`` or a ``.model`` under another name).
"""

from __future__ import annotations

import os
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import Tokenizer
from bloomline.dataprep.tokenizer.registry import KINDS, TOKENIZER_SPEC_HELP

__all__ = ["load_tokenizer", "tokenizer_kind"]

_SNIFF_BYTES = 64  # what the kinds' sniff() look at


def tokenizer_kind(spec: str | os.PathLike) -> tuple[str, str]:
    """``(kind, path or name to load)`` of a ``--tokenizer`` value.

    Raises:
        UserError: when it names nothing, or a file of no kind we read.
    """
    text = str(spec)
    if not text:
        raise UserError(f"--tokenizer: empty; give {TOKENIZER_SPEC_HELP}")
    path = Path(text)
    exists = path.exists()
    for name, kind in KINDS.items():
        if kind.claims_name(text, exists):
            return name, text
    if path.is_dir():
        for name, kind in KINDS.items():
            if kind.folder_file is not None and (path / kind.folder_file).is_file():
                return name, str(path / kind.folder_file)
        files = " or ".join(k.folder_file for k in KINDS.values() if k.folder_file)
        raise UserError(f"{text}: a folder without {files}")
    if not exists:
        raise UserError(f"{text}: tokenizer not found (expected {TOKENIZER_SPEC_HELP})")
    for name, kind in KINDS.items():
        if path.suffix in kind.suffixes:
            return name, text
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as err:
        raise UserError(f"{text}: cannot read ({err.strerror})") from None
    for name, kind in KINDS.items():
        if kind.sniff(head):
            return name, text
    raise UserError(f"{text}: not a tokenizer file of a kind we read "
                    f"(expected {TOKENIZER_SPEC_HELP})")


def load_tokenizer(spec: str | os.PathLike, eod_token: str | None = None) -> Tokenizer:
    """Load the tokenizer that ``spec`` names (see the module docstring for the kinds).

    Args:
        spec: a path or a tiktoken name.
        eod_token: the token that ends documents, when the tokenizer's files do not say (see
            each kind's module for how EOD is found otherwise). Empty means None.

    Raises:
        UserError: one line naming the file and what is wrong with it.
    """
    kind, target = tokenizer_kind(spec)
    tokenizer = KINDS[kind](target, eod_token or None)
    tokenizer.spec = str(spec)  # as given, for messages; workers reload from its target
    return tokenizer
