"""``inspect-data tokens``: how a token file uses its vocabulary.

One histogram of every token id, accumulated with ``np.bincount`` chunk by chunk, answers all
the questions: the most frequent tokens, the share of byte-fallback pieces (text the
tokenizer had no piece for), how many EOD tokens (documents that got one) and how much of the
vocabulary is never used.
"""

from __future__ import annotations

import os

import numpy as np

from bloomline.tools.corpus import check_token_chunk, iter_token_chunks, open_dataset
from bloomline.tools.tables import format_table
from bloomline.tools.vocab import Vocabulary

__all__ = ["count_tokens", "format_token_stats", "token_histogram"]

# bincount widens its input to int64: 16 MiB of uint16 tokens make a 64 MiB temporary
_HISTOGRAM_CHUNK_BYTES = 16 << 20


def token_histogram(prefix: str | os.PathLike, vocab: Vocabulary) -> np.ndarray:
    """Occurrences of every id of the vocabulary in ``prefix``'s ``.bin`` (int64).

    Raises:
        UserError: an id outside the vocabulary, naming its document and position.
    """
    dataset = open_dataset(prefix)
    histogram = np.zeros(vocab.vocab_size, dtype=np.int64)
    for start, chunk in iter_token_chunks(dataset, _HISTOGRAM_CHUNK_BYTES):
        # range check first: bincount would silently grow the histogram past the vocabulary
        check_token_chunk(dataset, start, chunk, vocab.vocab_size, f" of {vocab.model_path}")
        histogram += np.bincount(chunk, minlength=vocab.vocab_size)
    return histogram


def count_tokens(prefix: str | os.PathLike, vocab: Vocabulary, top: int = 20) -> dict:
    """Top-``top`` tokens with their pieces, byte-fallback share, EOD count, unused share."""
    histogram = token_histogram(prefix, vocab)
    total = int(histogram.sum())
    order = np.argsort(-histogram, kind="stable")[: max(0, top)]
    top_rows = [{"id": int(i), "piece": vocab.piece(int(i)), "text": vocab.piece_text(int(i)),
                 "count": int(histogram[i]),
                 "share": float(histogram[i] / total) if total else 0.0}
                for i in order.tolist() if histogram[i]]
    unused = histogram == 0
    unused[vocab.unassigned_ids] = False  # ids no token has are no part of the vocabulary
    tokens_in_vocabulary = vocab.vocab_size - len(vocab.unassigned_ids)
    return {
        "prefix": str(prefix), "tokenizer": vocab.model_path, "vocab_size": vocab.vocab_size,
        "tokens": total,
        "byte_fallback_tokens": int(histogram[vocab.is_byte].sum()),
        "byte_fallback_share": float(histogram[vocab.is_byte].sum() / total) if total else 0.0,
        "eod_id": vocab.eod_id,
        "eod_count": int(histogram[vocab.eod_id]) if vocab.eod_id is not None else 0,
        "unused_ids": int(unused.sum()),
        "unused_share": float(unused.sum() / tokens_in_vocabulary) if tokens_in_vocabulary else 0.0,
        "top": top_rows,
    }


def format_token_stats(result: dict) -> str:
    """The key figures, then the top tokens as a table."""
    lines = [
        f"{result['prefix']}: {result['tokens']:,} tokens, vocabulary {result['vocab_size']:,} "
        f"({result['tokenizer']})",
        f"byte fallback: {result['byte_fallback_tokens']:,} tokens "
        f"({result['byte_fallback_share']:.3%})",
        f"EOD (id {result['eod_id']}): {result['eod_count']:,}",
        f"never used: {result['unused_ids']:,} ids ({result['unused_share']:.1%} of the "
        "vocabulary)",
    ]
    # the piece as the vocabulary spells it, and as text (byte-level BPE spells a space Ġ)
    rows = [["rank", "id", "piece", "text", "count", "share"]]
    for rank, row in enumerate(result["top"], start=1):
        rows.append([str(rank), str(row["id"]), repr(row["piece"]), repr(row["text"]),
                     f"{row['count']:,}", f"{row['share']:.3%}"])
    return "\n".join(lines + format_table(rows))
