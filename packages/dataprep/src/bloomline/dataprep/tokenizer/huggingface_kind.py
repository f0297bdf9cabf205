"""Hugging Face ``tokenizer.json`` files, run by the ``tokenizers`` library (the Rust one).

BLOOM, GPT-2, Llama 3, Falcon and most models users continue from ship one. Ids are the
library's own ``encode(text).ids``: with the file's post-processor, as Megatron's
``HuggingFaceTokenizer`` tokenizes (a Llama 3 file puts ``<|begin_of_text|>`` before every
document; BLOOM's and GPT-2's add nothing).

EOD (Megatron: the model's ``eos_token``), in this order:

1. ``eod_token`` when given (``--eod-token`` / ``data.eod_token``);
2. ``eos_token`` of a ``tokenizer_config.json`` beside the ``tokenizer.json`` (what
   ``AutoTokenizer`` reads);
3. the first of ``<|endoftext|>`` (GPT-2, Falcon), ``</s>`` (BLOOM, Llama 2),
   ``<|end_of_text|>`` (Llama 3), ``<eos>`` (Gemma) that the vocabulary has.

BOS, PAD and UNK are found the same way, without the first step.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer.base import MAX_TOKEN_ID, Tokenizer
from bloomline.dataprep.tokenizer.byte_level import piece_bytes

__all__ = ["HuggingFaceTokenizer", "WELL_KNOWN_TOKENS"]

# role -> tokens that play it in widely used tokenizer.json files, most common first
WELL_KNOWN_TOKENS = {
    "eod": ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>"),
    "pad": ("<pad>", "<|pad|>"),
    "unk": ("<unk>",),
}
_CONFIG_KEYS = {"eod": "eos_token", "bos": "bos_token", "pad": "pad_token", "unk": "unk_token"}
_BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")
# Batches of at least this many characters are encoded on a helper thread (see encode_batch):
# starting one costs far less than encoding them (docs/perf/dataprep-tokenize.md).
_HELPER_THREAD_CHARS = 1 << 16


class HuggingFaceTokenizer(Tokenizer):
    """A ``tokenizer.json`` (or a folder holding one).

    Raises:
        UserError: when the file is missing or not a ``tokenizer.json`` the library reads, or
            ``eod_token`` is not in its vocabulary.
    """

    kind = "huggingface"
    spec_help = "a Hugging Face tokenizer.json or a folder with one"
    suffixes = (".json",)
    folder_file = "tokenizer.json"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head.lstrip().startswith(b"{")  # a tokenizer.json under another name

    def __init__(self, spec: str, eod_token: str | None = None) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        super().__init__(spec, eod_token)
        path = Path(spec)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"{spec}: no tokenizer.json there")
        self.path = str(path)
        try:
            self._tok = RustTokenizer.from_file(self.path)
        except Exception as err:  # the library raises plain Exception for any parse error
            raise UserError(f"{path}: not a tokenizer.json the tokenizers library reads "
                            f"({str(err).splitlines()[0][:200]})") from None
        self._tok.no_padding()
        self._tok.no_truncation()
        self._byte_level: bool | None = None  # token_bytes reads it from the decoder
        # not get_vocab_size(): it counts entries, fewer than the id space when added tokens
        # sit above the base vocabulary with unused ids between (base.py's docstring)
        self._vocab_size = _largest_id(path, self._tok) + 1
        self.special_ids = self._find_special_ids(path.parent / "tokenizer_config.json")
        if eod_token is not None:
            token_id = self._tok.token_to_id(eod_token)
            if token_id is None:
                raise UserError(f"{path}: --eod-token {eod_token!r} is not in its vocabulary")
            self.special_ids["eod"] = token_id

    def _find_special_ids(self, config_path: Path) -> dict[str, int]:
        config: dict = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except RecursionError:
                raise UserError(f"{config_path}: JSON nested too deeply to read") from None
            except (OSError, ValueError) as err:
                raise UserError(f"{config_path}: not readable JSON ({err})") from None
        found: dict[str, int] = {}
        for role, candidates in WELL_KNOWN_TOKENS.items():
            named = config.get(_CONFIG_KEYS[role])
            if isinstance(named, dict):  # {"content": "</s>", "lstrip": false, ...}
                named = named.get("content")
            for token in ([named] if isinstance(named, str) else []) + list(candidates):
                token_id = self._tok.token_to_id(token)
                if token_id is not None:
                    found[role] = token_id
                    break
        return found

    def _eod_hint(self) -> str:
        return (" (no eos_token in a tokenizer_config.json beside it, and none of "
                + ", ".join(WELL_KNOWN_TOKENS["eod"]) + " in its vocabulary)")

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        try:
            big = sum(map(len, texts)) >= _HELPER_THREAD_CHARS
        except TypeError:  # not all strings: the library's own error says which
            big = False
        if big and threading.current_thread() is threading.main_thread():
            # The library spends much of its time in malloc and free (a string per token).
            # On the main thread they go to glibc's main arena, which the interpreter shares,
            # and ran slower there than on any other thread, which gets an arena of its own
            # (docs/perf/dataprep-tokenize.md). So a big batch is encoded on a helper thread
            # while this one waits; the ids are the same.
            with ThreadPoolExecutor(1, thread_name_prefix="tokenizers-encode") as helper:
                return helper.submit(self._encode_ids, texts).result()
        return self._encode_ids(texts)

    def _encode_ids(self, texts: list[str]) -> list[np.ndarray]:
        # encode_batch_fast skips the character offsets, which we never use. The library runs
        # a batch on its own thread pool unless TOKENIZERS_PARALLELISM is false; the pipeline's
        # workers set it (one thread each, see chunk_worker.init_worker).
        encodings = self._tok.encode_batch_fast(texts)
        return [np.array(e.ids, dtype=np.int32) for e in encodings]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._tok.id_to_token(int(token_id))
        return "" if piece is None else piece

    def token_bytes(self, token_id: int) -> bytes | None:
        if self._byte_level is None:  # read once: a byte-level decoder spells every byte
            decoder = self._tok.decoder
            self._byte_level = decoder is not None and b'"ByteLevel"' in decoder.__getstate__()
        if self._byte_level:
            spelled = piece_bytes(self.id_to_piece(token_id))
            if spelled is not None:
                return spelled
        return super().token_bytes(token_id)

    def control_ids(self) -> list[int]:
        special = [i for i, token in self._tok.get_added_tokens_decoder().items()
                   if token.special]
        return sorted(set(special) | set(self.special_ids.values()))

    def unassigned_ids(self) -> list[int]:
        assigned = np.zeros(self.vocab_size, dtype=bool)
        assigned[list(self._tok.get_vocab(with_added_tokens=True).values())] = True
        return np.flatnonzero(~assigned).tolist()

    def byte_ids(self) -> list[int]:
        # byte-fallback BPE (Llama 2 style) spells bytes <0xAB>; byte-level BPE has no fallback
        vocab = self._tok.get_vocab(with_added_tokens=False)
        return sorted(i for token, i in vocab.items() if _BYTE_PIECE.match(token))

    def _vocabulary_entries(self) -> Iterable[bytes]:
        by_id = [""] * self.vocab_size
        for token, i in self._tok.get_vocab(with_added_tokens=True).items():
            by_id[i] = token  # an unassigned id hashes as an empty entry
        return (token.encode("utf-8") for token in by_id)

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` itself (for exporting and training)."""
        return self._tok

    def to_tokenizer_json(self) -> str:
        # the loaded backend has padding and truncation switched off, as our encode runs it
        return self._tok.to_str()


def _largest_id(path: Path, tok) -> int:
    """The largest id of any token (-1: none), checked to fit a token file.

    The library reads ids as unsigned 32-bit numbers (a negative id is its own parse error),
    so ids from 2**31 up load, and would wrap to negative ids in int32 token files.

    Raises:
        UserError: naming the token whose id is above :data:`MAX_TOKEN_ID`.
    """
    ids = dict(tok.get_vocab(with_added_tokens=True))
    for token_id, added in tok.get_added_tokens_decoder().items():
        ids.setdefault(added.content, token_id)
    if not ids:
        return -1
    token, largest = max(ids.items(), key=lambda item: item[1])
    if largest > MAX_TOKEN_ID:
        raise UserError(f"{path}: token {token!r} has id {largest:,}, above "
                        f"{MAX_TOKEN_ID:,}, the largest id a token file holds; renumber it")
    return largest
