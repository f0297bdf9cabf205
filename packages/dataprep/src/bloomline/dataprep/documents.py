"""Documents out of a chunk: the texts of each key, checked, with bad lines named or skipped.

Every problem with the input is reported as ``FILE:LINE: what`` (``FILE: row N: what`` for
Parquet and dataset folders). With ``skip_bad_lines`` a bad line is counted and skipped for
all keys at once, so the outputs of several ``--json-key``\\ s stay aligned document by document.
Each format reads its own chunks (:mod:`bloomline.dataprep.formats`); this is the entry point
the workers call.
"""

from __future__ import annotations

from bloomline.dataprep.formats import FORMATS
from bloomline.dataprep.formats.base import (
    DEFAULT_MAX_DOCUMENT_BYTES,
    BadInputError,
    Chunk,
    ChunkDocuments,
    DocumentCollector,
)

__all__ = ["DEFAULT_MAX_DOCUMENT_BYTES", "BadInputError", "ChunkDocuments", "extract_documents"]


def extract_documents(chunk: Chunk, keys: list[str], skip_bad_lines: bool = False,
                      max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> ChunkDocuments:
    """The texts of every document of ``chunk`` for every key, in input order.

    A line (file, value) of more than ``max_document_bytes`` is a bad line: it is named
    before anything decodes or tokenizes it.

    Text inputs (``.txt``) have no keys: their one text goes under ``keys[0]``.

    Raises:
        BadInputError: at the first bad line unless ``skip_bad_lines``.
    """
    out = DocumentCollector(keys, skip_bad_lines, max_document_bytes)
    FORMATS[chunk.source.format].documents(chunk, keys, out)
    return out.docs
