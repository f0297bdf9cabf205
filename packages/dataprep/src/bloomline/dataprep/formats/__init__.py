"""Input formats, one module each: which files are theirs, how a file is cut into chunks, how
a chunk becomes documents, and which part of a file a ``--shard`` owns.

=================  ==============================================================
module             inputs
=================  ==============================================================
``jsonl``          ``.jsonl`` / ``.json`` (one object per line), ``.zst`` / ``.gz``
``text``           ``.txt``: a document per file, or per line (``--txt-per-line``)
``parquet``        ``.parquet``: a document per row
``hf_dataset``     ``save_to_disk`` folders: a document per row
=================  ==============================================================

``base`` holds what they share (sources, chunks, the :class:`~.base.Format` record),
``lines`` the line files' cutting and compressions, ``arrow_rows`` the columnar readers'
rows, and ``registry`` the list. :mod:`bloomline.dataprep.sources`,
:mod:`bloomline.dataprep.documents` and :mod:`bloomline.dataprep.sharding` dispatch through it.
"""

from bloomline.dataprep.formats.base import Chunk, Format, Source
from bloomline.dataprep.formats.registry import (
    FORMATS,
    SUPPORTED_SUFFIXES,
    folder_format,
    format_of_file,
)

__all__ = ["FORMATS", "SUPPORTED_SUFFIXES", "Chunk", "Format", "Source", "folder_format",
           "format_of_file"]
