"""tiktoken encodings, offline: by name from tiktoken's cache, or from a ``.tiktoken`` file.

- ``tiktoken:NAME`` (or a bare ``NAME`` such as ``cl100k_base`` that is not a path): tiktoken's
  own encoding, read from its cache (``TIKTOKEN_CACHE_DIR``, else the temp folder's
  ``data-gym-cache``). We never download: a data job runs on nodes that often have no
  network, and N workers downloading at once would race. A name that is not cached fails
  with one line that says how to get it.
- ``PATH/NAME.tiktoken``: the ranks in that file, with the split pattern and special tokens
  of tiktoken's encoding NAME (``cl100k_base.tiktoken`` gets cl100k_base's). tiktoken's file
  format holds only the ranks; the rest comes from tiktoken's own definition of the
  encoding, which we run with its file reads pointed at this file.

Ids are ``encode_ordinary``'s: text that spells a special token (``<|endoftext|>``) stays
text, as it should inside a document. EOD is ``<|endoftext|>``, or ``eod_token``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import MAX_TOKEN_ID, Tokenizer
from bloomline.dataprep.tokenizer.tiktoken_convert import tiktoken_to_tokenizers

__all__ = ["TiktokenTokenizer", "tiktoken_names"]

_EOD = "<|endoftext|>"
_PREFIX = "tiktoken:"
# tiktoken's loader functions are module globals; loads that redirect them take turns
_LOAD_LOCK = threading.Lock()


class _NotCachedError(Exception):
    pass


def tiktoken_names() -> list[str]:
    """Encoding names tiktoken knows (its own and its plugins'), or [] without tiktoken."""
    try:
        import tiktoken
    except ImportError:
        return []
    return list(tiktoken.list_encoding_names())


def _require_tiktoken(spec: str):
    try:
        import tiktoken
    except ImportError:
        raise UserError(f"{spec}: a tiktoken encoding needs the tiktoken package: "
                        "pip install 'bloomline-dataprep[tiktoken]'") from None
    return tiktoken


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding.

    Raises:
        UserError: an unknown encoding name, a name that is not in tiktoken's cache, a
            ``.tiktoken`` file that is missing or malformed, or ``eod_token`` not a token.
    """

    kind = "tiktoken"
    spec_help = "a tiktoken .tiktoken file or tiktoken:NAME"
    suffixes = (".tiktoken",)
    specials_read_as_text = True

    @classmethod
    def claims_name(cls, text: str, exists: bool) -> bool:
        # a bare NAME only when no such path exists (and only then is tiktoken imported)
        return text.startswith(_PREFIX) or (
            not exists and "/" not in text and text in tiktoken_names())

    def __init__(self, spec: str, eod_token: str | None = None) -> None:
        super().__init__(spec, eod_token)
        self._encoding = _load_encoding(spec)
        self._vocab_size = self._encoding.n_vocab  # tiktoken's: the largest token id + 1
        specials = self._encoding.special_tokens_set
        token = eod_token if eod_token is not None else _EOD
        if eod_token is not None or token in specials:
            try:
                self.special_ids["eod"] = self._encoding.encode_single_token(token)
            except KeyError:
                raise UserError(f"{spec}: --eod-token {token!r} is not a token of the "
                                "encoding") from None

    @property
    def name(self) -> str:
        return self._encoding.name

    @property
    def encoding(self):
        """The ``tiktoken.Encoding`` itself (for exporting and converting)."""
        return self._encoding

    def _eod_hint(self) -> str:
        return f" (it has no {_EOD})"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # encode_to_numpy hands the ids over as a buffer (no Python int per token);
        # disallowed_special=() keeps special-token spellings inside documents as text
        encode = self._encoding.encode_to_numpy
        return [encode(text, disallowed_special=()) for text in texts]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        specials = set(self.control_ids())
        return self._encoding.decode([int(i) for i in ids if int(i) not in specials])

    def id_to_piece(self, token_id: int) -> str:
        try:
            return self._encoding.decode_single_token_bytes(int(token_id)).decode(
                "utf-8", errors="backslashreplace")
        except KeyError:
            return ""

    def token_bytes(self, token_id: int) -> bytes | None:
        try:
            return self._encoding.decode_single_token_bytes(int(token_id))
        except KeyError:
            return None

    def control_ids(self) -> list[int]:
        return sorted(self._encoding.encode_single_token(token)
                      for token in self._encoding.special_tokens_set)

    def unassigned_ids(self) -> list[int]:
        return [i for i, entry in enumerate(self._entries_or_none()) if entry is None]

    def to_tokenizer_json(self) -> str:
        return tiktoken_to_tokenizers(self._encoding, self.spec).to_str()

    def _vocabulary_entries(self) -> Iterable[bytes]:
        return (b"" if entry is None else entry for entry in self._entries_or_none())

    def _entries_or_none(self) -> Iterator[bytes | None]:
        """Every id's bytes in id order; None where no token has the id (ranks may leave gaps
        below the special tokens)."""
        for i in range(self.vocab_size):
            try:
                yield self._encoding.decode_single_token_bytes(i)
            except KeyError:
                yield None


def _load_encoding(spec: str):
    tiktoken = _require_tiktoken(spec)
    from tiktoken import registry

    names = tiktoken.list_encoding_names()
    if spec.endswith(".tiktoken"):
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"{spec}: tiktoken file not found")
        name, ranks_file = path.name[: -len(".tiktoken")], path
    else:
        name, ranks_file = spec.removeprefix(_PREFIX), None
    if name not in names:
        what = f"{spec}: the file name must be an encoding" if ranks_file else (
            f"{spec}: not an encoding")
        raise UserError(f"{what} tiktoken knows ({', '.join(sorted(names))})")
    constructor = registry.ENCODING_CONSTRUCTORS[name]
    try:
        with _LOAD_LOCK, _reads_redirected(tiktoken.load, ranks_file):
            params = constructor()
    except _NotCachedError as err:
        raise UserError(
            f"{spec}: not in tiktoken's cache ({_cache_dir()}) and we do not download; run "
            f"python -c \"import tiktoken; tiktoken.get_encoding('{name}')\" once with network "
            f"access and TIKTOKEN_CACHE_DIR set to a shared folder, or give its .tiktoken file "
            f"({err})") from None
    except (ValueError, KeyError, UnicodeDecodeError) as err:
        raise UserError(f"{spec}: not a tiktoken ranks file (lines of base64 token and rank: "
                        f"{str(err).splitlines()[0][:120]})") from None
    if ranks_file is not None:
        params.pop("explicit_n_vocab", None)  # a custom file may have another size
        ranks = set(params["mergeable_ranks"].values())
        for token, rank in params.get("special_tokens", {}).items():
            if rank in ranks:
                raise UserError(f"{spec}: rank {rank} is also the id of {name}'s special "
                                f"token {token!r}; give that token's id to no ranks line")
    return tiktoken.Encoding(**params)


def _cache_dir() -> str:
    import tempfile

    return (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), "data-gym-cache"))


@contextlib.contextmanager
def _reads_redirected(load_module, ranks_file: Path | None) -> Iterator[None]:
    """Run a tiktoken encoding constructor offline.

    With a ``ranks_file``, every ranks download it asks for reads that file instead. Without,
    cached downloads are read as tiktoken reads them, and a download that is not cached
    raises :class:`_NotCachedError` instead of going to the network.
    """
    name = "read_file_cached" if ranks_file is not None else "read_file"
    original = getattr(load_module, name)
    if ranks_file is not None:
        if ranks_file.stem == "gpt2":
            raise UserError(f"{ranks_file}: gpt2's ranks come as vocab.bpe + encoder.json; "
                            "use r50k_base.tiktoken (the same ids)")
        data = ranks_file.read_bytes()
        _check_ranks(ranks_file, data)

        def replacement(blobpath: str, expected_hash: str | None = None) -> bytes:
            return data
    else:
        def replacement(blobpath: str) -> bytes:
            if "://" in blobpath:
                raise _NotCachedError(blobpath)
            return original(blobpath)
    setattr(load_module, name, replacement)
    try:
        yield
    finally:
        setattr(load_module, name, original)


def _check_ranks(path: Path, data: bytes) -> None:
    """One line naming the first bad line, instead of tiktoken's bare ValueError (or its
    silence: a repeated token or rank would leave the ids meaning something else).

    Raises:
        UserError: no ranks, a malformed line, a rank outside ``[0, MAX_TOKEN_ID]`` (no token
            file holds it), or a token or rank given twice (both lines named).
    """
    token_lines: dict[bytes, int] = {}
    rank_lines: dict[int, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except ValueError:
            raise UserError(f"{path}:{number}: not a tiktoken ranks line (base64 token, space, "
                            "rank)") from None
        if not 0 <= rank <= MAX_TOKEN_ID:
            raise UserError(f"{path}:{number}: rank {rank} is outside 0..{MAX_TOKEN_ID:,}, the "
                            "ids a token file holds")
        if token in token_lines:
            raise UserError(f"{path}:{number}: token {token!r} again (first on line "
                            f"{token_lines[token]}); each token has one rank")
        if rank in rank_lines:
            raise UserError(f"{path}:{number}: rank {rank} again (first on line "
                            f"{rank_lines[rank]}); each rank is one token's")
        token_lines[token] = number
        rank_lines[rank] = number
    if not token_lines:
        raise UserError(f"{path}: holds no ranks (expected lines of base64 token, space, rank)")
