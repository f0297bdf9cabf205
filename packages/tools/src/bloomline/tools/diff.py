"""``inspect-data diff``: where two token files first differ, or that they are identical.

Two files are identical when they hold the same documents with the same token ids (the dtype
may differ: uint16 and int32 files of one tokenization are the same data). The token streams
are compared chunk by chunk over both memory maps; document lengths come from the indices. The
first difference is the earlier of the first differing token and the first document whose
length differs (which also catches equal streams cut into different documents).
"""

from __future__ import annotations

import os

import numpy as np

from bloomline.tools import corpus
from bloomline.tools.corpus import (
    document_lengths,
    locate_token,
    map_tokens,
    open_dataset,
)

__all__ = ["diff_token_files", "format_diff"]


def _first_different_token(a: np.ndarray, b: np.ndarray, step: int) -> int | None:
    """Position of the first differing token of the common prefix of two streams."""
    common = min(len(a), len(b))
    for start in range(0, common, step):
        stop = min(common, start + step)
        different = np.flatnonzero(a[start:stop] != b[start:stop])
        if different.size:
            return start + int(different[0])
    return None


def _first_different_length(lengths_a: np.ndarray, lengths_b: np.ndarray) -> int | None:
    common = min(len(lengths_a), len(lengths_b))
    different = np.flatnonzero(lengths_a[:common] != lengths_b[:common])
    if different.size:
        return int(different[0])
    return common if len(lengths_a) != len(lengths_b) else None


def diff_token_files(prefix_a: str | os.PathLike, prefix_b: str | os.PathLike) -> dict:
    """Compare two token files.

    Returns:
        ``{"identical", "a", "b", "first_difference"}``; the difference (None when identical)
        names the document, the token position in it and both values (None past an end).
    """
    a, b = open_dataset(prefix_a), open_dataset(prefix_b)
    lengths_a, lengths_b = document_lengths(a), document_lengths(b)
    tokens_a, tokens_b = map_tokens(a), map_tokens(b)
    step = corpus.CHUNK_BYTES // max(a.dtype.itemsize, b.dtype.itemsize)
    token = _first_different_token(tokens_a, tokens_b, step)
    by_length = _first_different_length(lengths_a, lengths_b)
    difference = None
    if token is not None:
        document, _, position = locate_token(a, token)
        if by_length is None or document <= by_length:
            # every earlier document has the same length in both: same start in both streams
            difference = {"document": document, "token": position,
                          "a": int(tokens_a[token]), "b": int(tokens_b[token]),
                          "reason": "token ids differ"}
    if difference is None and by_length is not None:
        document = by_length
        length_a = int(lengths_a[document]) if document < len(lengths_a) else None
        length_b = int(lengths_b[document]) if document < len(lengths_b) else None
        position = min(x for x in (length_a, length_b) if x is not None) if (
            length_a is not None and length_b is not None) else 0
        start = int(lengths_a[:document].sum())  # same in b: earlier lengths are equal
        value_a = int(tokens_a[start + position]) if (
            length_a is not None and position < length_a) else None
        value_b = int(tokens_b[start + position]) if (
            length_b is not None and position < length_b) else None
        reason = ("document lengths differ" if length_a is not None and length_b is not None
                  else f"only {'a' if length_a is not None else 'b'} has this document")
        difference = {"document": document, "token": position, "a": value_a, "b": value_b,
                      "reason": reason, "length_a": length_a, "length_b": length_b}

    def side(dataset, lengths):
        return {"prefix": dataset.path_prefix, "dtype": dataset.dtype.name,
                "documents": len(lengths), "tokens": dataset.num_tokens}

    return {"identical": difference is None, "a": side(a, lengths_a), "b": side(b, lengths_b),
            "first_difference": difference}


def format_diff(result: dict) -> str:
    """``identical`` or where the first difference is."""
    a, b = result["a"], result["b"]
    sizes = (f"a: {a['documents']:,} documents, {a['tokens']:,} tokens ({a['dtype']}); "
             f"b: {b['documents']:,} documents, {b['tokens']:,} tokens ({b['dtype']})")
    if result["identical"]:
        return f"identical: {a['prefix']} and {b['prefix']} ({sizes})"
    d = result["first_difference"]
    line = (f"first difference: document {d['document']:,}, token {d['token']:,}: "
            f"{d['reason']}")
    if "length_a" in d:
        line += f" (a: {d['length_a']} tokens, b: {d['length_b']} tokens)"
    line += f"; a has {d['a']}, b has {d['b']}"
    return f"{line}\n{sizes}"
