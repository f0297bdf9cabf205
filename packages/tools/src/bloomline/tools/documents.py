"""``inspect-data show``: one document of a token file, as text or as token ids."""

from __future__ import annotations

import os

from bloomline.tools.corpus import document_tokens, open_dataset
from bloomline.tools.vocab import Vocabulary

__all__ = ["format_document", "show_document"]


def show_document(prefix: str | os.PathLike, document: int,
                  vocab: Vocabulary | None = None) -> dict:
    """Document ``document`` of ``prefix``: its sequences, tokens and (with ``vocab``) text.

    Raises:
        UserError: the document is out of range, or ids the tokenizer cannot decode.
    """
    dataset = open_dataset(prefix)
    tokens = document_tokens(dataset, document)
    first, last = dataset.document_indices[document : document + 2].tolist()
    result = {"prefix": dataset.path_prefix, "document": document,
              "documents": dataset.num_documents, "sequences": list(range(first, last)),
              "num_tokens": len(tokens), "tokens": tokens.tolist()}
    if vocab is not None:
        vocab.check_ids(tokens, f"{dataset.bin_path}: document {document}")
        result["text"] = vocab.render(tokens)
    return result


def format_document(result: dict) -> str:
    """A header line, then the text (with a tokenizer) or the ids."""
    sequences = result["sequences"]
    where = (f"sequence {sequences[0]}" if len(sequences) == 1 else
             f"sequences {sequences[0]}..{sequences[-1]}" if sequences else "no sequence")
    head = (f"{result['prefix']}: document {result['document']:,} of {result['documents']:,} "
            f"({where}), {result['num_tokens']:,} tokens")
    body = result["text"] if "text" in result else " ".join(map(str, result["tokens"]))
    return f"{head}\n{body}"
