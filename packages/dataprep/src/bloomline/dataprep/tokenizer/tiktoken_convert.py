"""A tiktoken encoding as a byte-level BPE ``tokenizers`` pipeline with the same ids.

tiktoken and a byte-level BPE do the same thing in the same order: split the text with a regex,
then merge the bytes of each piece, lowest rank first. What differs is only how the merges are
written down: tiktoken keeps ranks of byte strings and merges any adjacent pair whose
concatenation has a rank; ``tokenizers`` keeps a list of pairs. So:

- vocabulary: every token's bytes spelled in the GPT-2 byte-to-unicode alphabet (what the
  ``ByteLevel`` pre-tokenizer maps text into), at its rank; special tokens at their ids.
- merges: for each token, the pair tiktoken ends up merging to make it. The bytes inside a
  token merge as if alone (a merge across its edges would have made another token), so
  tiktoken's own procedure run on the token's bytes with the lower ranks gives that pair.
  A token it cannot make from two parts is only ever produced whole (next point).
- ``ignore_merges``: tiktoken takes a regex piece that is itself a token without merging;
  so does ``BPE(ignore_merges=True)``.
- pre-tokenizer: the encoding's regex as a ``Split`` (``isolated``), then ``ByteLevel`` without
  its own regex; decoder ``ByteLevel``.
- special tokens: added tokens. Our ids are ``encode_ordinary``'s (a special token's spelling in
  a document is text), which the export's ``split_special_tokens`` reproduces in transformers.

The regex runs on ``tokenizers``' Oniguruma engine instead of tiktoken's ``fancy-regex``; the
patterns of tiktoken's encodings use only what both read the same way (possessive
quantifiers, ``\\p{..}`` classes, a ``(?!\\S)`` lookahead; ``$`` comes only after ``\\s++``,
which leaves no line end before it).
"""

from __future__ import annotations

import re

from bloomline.common.errors import UserError

__all__ = ["byte_to_unicode", "split_pattern", "tiktoken_to_tokenizers"]


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte: printable Latin-1 stands for itself, the other
    68 bytes (controls, space, ...) for the code points from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def split_pattern(encoding) -> str:
    """The encoding's split regex, written for Oniguruma: it reads a possessive interval
    ``X{1,3}+`` as "``X{1,3}`` one or more times" (cl100k_base's digits would not be cut in
    threes). In tiktoken's patterns the interval ends its alternative, where possessive and
    greedy match alike, so the ``+`` is dropped."""
    # tiktoken.Encoding has no public accessor for its pattern
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", encoding._pat_str)


def _merge_pair(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes] | None:
    """The two parts tiktoken merges last to make ``token``: its byte-pair merging run on the
    token's bytes with the ranks below the token's own; None when that ends in more than two
    parts (the token is only reachable whole)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best = rank, -1
        for i in range(len(parts) - 1):
            pair_rank = ranks.get(parts[i] + parts[i + 1])
            if pair_rank is not None and pair_rank < best_rank:
                best_rank, best = pair_rank, i
        if best < 0:
            return None
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def tiktoken_to_tokenizers(encoding, name: str = "tiktoken encoding"):
    """A ``tokenizers.Tokenizer`` whose ``encode(text).ids`` (with special tokens read as text)
    are ``encoding.encode_ordinary(text)`` and whose decode is ``encoding.decode``.

    Args:
        encoding: a ``tiktoken.Encoding``.
        name: what to call it in errors (its file or name).

    Raises:
        UserError: ranks that take a special token's id (a ranks file longer than the
            encoding it is named after allows), so that one id would be two tokens.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    special = {token: encoding.encode_single_token(token) for token in encoding.special_tokens_set}
    # ranks may leave gaps (below the special tokens, say)
    ranks = {token: encoding.encode_single_token(token) for token in encoding.token_byte_values()}
    rank_ids = set(ranks.values())
    for token, token_id in special.items():
        if token_id in rank_ids:
            raise UserError(f"{name}: id {token_id} of the special token {token} is also a "
                            f"rank in the ranks file: more ranks than {encoding.name} has "
                            "room for")
    spell = byte_to_unicode()

    def spelled(token: bytes) -> str:
        return "".join(spell[byte] for byte in token)

    vocab = {spelled(token): rank for token, rank in ranks.items()}
    vocab.update(special)  # in the model's vocabulary too, so that they keep their ids
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1 and (pair := _merge_pair(ranks, token, rank)) is not None:
            merges.append((spelled(pair[0]), spelled(pair[1])))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True,
                                   fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern(encoding)), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token in sorted(special, key=special.get)])
    return backend
