"""Which tokenizer made a token file: ``NAME.fingerprint.json`` beside ``NAME.bin/.idx``.

Megatron's ``.idx`` has no room for it (its header is fixed: magic, version, dtype code,
counts), so ``dataprep tokenize`` writes a small JSON file beside the pair::

    {"format": 1, "tokenizer": {"kind": "huggingface", "name": "tokenizer.json",
     "vocab_size": 250680, "eod_id": 2, "vocab_sha256": "…"}, "append_eod": true}

``vocab_sha256`` hashes every id's vocabulary entry (:meth:`Tokenizer.fingerprint`): two
tokenizers with the same hash give ids the same meaning. ``build-index`` refuses to blend files
of different tokenizers, and the trainer refuses a corpus whose files were made by another
tokenizer than ``data.tokenizer``. Token files without one (Megatron's own, or written before
fingerprints) are taken as they are: only their ids' range can be checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.errors import UserError

__all__ = ["FINGERPRINT_SUFFIX", "check_same_tokenizer", "check_tokenizer_matches",
           "corpus_prefixes", "read_fingerprint", "write_fingerprint"]

FINGERPRINT_SUFFIX = ".fingerprint.json"
_FORMAT = 1


def fingerprint_path(prefix: str | os.PathLike) -> Path:
    """``PREFIX.fingerprint.json``."""
    return Path(f"{prefix}{FINGERPRINT_SUFFIX}")


def write_fingerprint(prefix: str | os.PathLike, tokenizer, append_eod: bool) -> Path:
    """Record ``tokenizer`` (a :class:`~bloomline.dataprep.tokenizer.Tokenizer`) for PREFIX."""
    return write_fingerprint_record(
        prefix, {"format": _FORMAT, "tokenizer": tokenizer.describe(), "append_eod": append_eod})


def write_fingerprint_record(prefix: str | os.PathLike, record: dict) -> Path:
    """Write a record read from another file (``merge`` carries its inputs' record over)."""
    path = fingerprint_path(prefix)
    atomic_write_bytes(path, (json.dumps(record, indent=1) + "\n").encode())
    return path


def read_fingerprint(prefix: str | os.PathLike) -> dict | None:
    """The record of PREFIX, or None when there is none.

    Raises:
        UserError: a file that is not a fingerprint record (names the file).
    """
    path = fingerprint_path(prefix)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not readable JSON ({err}); delete it to skip the tokenizer "
                        "check, or tokenize again") from None
    tokenizer = record.get("tokenizer") if isinstance(record, dict) else None
    if not isinstance(tokenizer, dict) or "vocab_sha256" not in tokenizer:
        raise UserError(f"{path}: not a token-file fingerprint (no tokenizer.vocab_sha256)")
    return record


def _describe(info: dict) -> str:
    return (f"{info.get('kind')} {info.get('name')} (vocab {info.get('vocab_size')}, "
            f"sha256 {str(info.get('vocab_sha256'))[:12]})")


def check_same_tokenizer(prefixes: dict[str, str | os.PathLike]) -> dict | None:
    """The common record of token files that are used together (a blend, a merge).

    Args:
        prefixes: name -> prefix.

    Returns:
        The record of the first file that has one, or None when none has.

    Raises:
        UserError: two files made by different tokenizers (names both).
    """
    first_name, first = None, None
    for name, prefix in prefixes.items():
        record = read_fingerprint(prefix)
        if record is None:
            continue
        if first is None:
            first_name, first = name, record
        elif record["tokenizer"]["vocab_sha256"] != first["tokenizer"]["vocab_sha256"]:
            raise UserError(f"{prefix}: tokenized with {_describe(record['tokenizer'])}, but "
                            f"{first_name} with {_describe(first['tokenizer'])}; token files "
                            "used together must come from one tokenizer")
    return first


def check_tokenizer_matches(prefixes: dict[str, str | os.PathLike], tokenizer,
                            field: str = "--tokenizer") -> None:
    """Refuse token files that another tokenizer than ``tokenizer`` made.

    Raises:
        UserError: naming the file, both tokenizers and what to do.
    """
    expected = tokenizer.fingerprint()
    for prefix in prefixes.values():
        record = read_fingerprint(prefix)
        if record is not None and record["tokenizer"]["vocab_sha256"] != expected:
            raise UserError(
                f"{prefix}: tokenized with {_describe(record['tokenizer'])}, but {field} "
                f"{tokenizer.spec} is {_describe(tokenizer.describe())}; tokenize the corpus "
                f"with {field}, or set {field} to the tokenizer that made it")


def corpus_prefixes(corpus_dir: str | os.PathLike) -> dict[str, str]:
    """name -> prefix of every ``NAME.idx`` in a corpus folder (none when it is missing)."""
    return {path.stem: str(path)[: -len(".idx")]
            for path in sorted(Path(corpus_dir).glob("*.idx"))}
