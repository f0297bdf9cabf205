"""``inspect-data sample``: one training sample exactly as the trainer will see it.

A split's sample K is found the way :class:`BlendedSampleDataset` and
:class:`GPTSampleDataset` find it (blend: dataset and its sample number; then the shuffle,
sample and document indices), but kept as *spans*: which document, from which token to which,
so the boundaries can be marked. The tokens of the spans are checked against ``split[K]``
itself, so what is shown is what the trainer reads, or the command fails loudly.
"""

from __future__ import annotations

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.blended_samples import BlendedSampleDataset
from bloomline.dataprep.build_index import BuiltIndex
from bloomline.dataprep.gpt_samples import GPTSampleDataset
from bloomline.tools.vocab import Vocabulary

__all__ = ["describe_sample", "format_sample", "sample_spans", "split_dataset"]


def split_dataset(built: BuiltIndex, split: str, request_split: str
                  ) -> tuple[GPTSampleDataset | BlendedSampleDataset, list[str]]:
    """The sample dataset of ``split`` and the dataset names of its blend (one if no blend).

    Raises:
        UserError: no such split, or a token file whose index is corrupted.
    """
    if split not in built.splits:
        raise UserError(f"--from {split}: the corpus has no {split} split with "
                        f"--split {request_split} (it has: {', '.join(built.splits)})")
    names = list(built.report["splits"][split]["datasets"])
    split_ds = built.splits[split]
    # (opening each token file checked its whole index: no sample is shown through a bad
    # offset)
    return split_ds, names


def sample_spans(component: GPTSampleDataset, sample: int) -> list[dict]:
    """Where sample ``sample`` of one dataset's split comes from, one span per sequence.

    Each span is ``{"sequence", "document", "start", "stop"}``: tokens ``start:stop`` of that
    sequence (``document`` is the document owning the sequence; the same number for files
    with one sequence per document). The last span holds the extra token of the next sample.
    """
    index = component.index
    built = int(index.shuffle_index[sample])
    (first, first_offset), (last, last_offset) = index.sample_index[built : built + 2].tolist()
    dataset = component.dataset
    # at most L + 1 positions (sequences hold at least one token): a loop per sample is fine
    sequences = index.document_index[first : last + 1].astype(np.int64)
    documents = np.searchsorted(dataset.document_indices, sequences, side="right") - 1
    spans = []
    for position, (sequence, document) in enumerate(zip(sequences.tolist(),
                                                        documents.tolist(), strict=True)):
        start = first_offset if position == 0 else 0
        stop = (last_offset + component.extra if first + position == last
                else int(dataset.sequence_lengths[sequence]))
        if stop > start:
            spans.append({"sequence": sequence, "document": document, "start": start,
                          "stop": stop})
    return spans


def describe_sample(split_ds: GPTSampleDataset | BlendedSampleDataset, names: list[str],
                    sample: int, split: str = "train", vocab: Vocabulary | None = None) -> dict:
    """Sample ``sample`` of a split: its source, spans, tokens and (with ``vocab``) text.

    Raises:
        UserError: ``sample`` out of range, or ids the tokenizer cannot decode.
    """
    total = len(split_ds)
    if not 0 <= sample < total:
        raise UserError(f"--index {sample}: the {split} split has {total:,} samples "
                        f"(0..{total - 1})")
    if isinstance(split_ds, BlendedSampleDataset):
        number, own = split_ds.source(sample)
        component = split_ds.datasets[number]
    else:
        number, own, component = 0, sample, split_ds
    spans = sample_spans(component, own)
    dataset = component.dataset
    pieces = [dataset.get(s["sequence"], s["start"], s["stop"] - s["start"]) for s in spans]
    tokens = np.concatenate(pieces).astype(np.int64)
    if not np.array_equal(tokens, split_ds[sample]):
        # the spans are a re-derivation of GPTSampleDataset.__getitem__: never show a guess
        raise RuntimeError(f"bug: the spans of {split} sample {sample} do not match the "
                           "sample the trainer reads")
    result = {
        "split": split, "index": sample, "samples": total, "dataset": names[number],
        "dataset_number": number, "dataset_sample": own,
        "built_sample": int(component.index.shuffle_index[own]),
        "prefix": dataset.path_prefix, "num_tokens": len(tokens),
        "spans": spans, "tokens": tokens.tolist(),
    }
    if vocab is not None:
        vocab.check_ids(tokens, f"{dataset.bin_path}: {split} sample {sample}")
        for span, piece in zip(spans, pieces, strict=True):
            span["text"] = vocab.render(piece)
    return result


def _marker(span: dict, dataset: str, first: bool) -> str:
    where = f" from token {span['start']}" if first and span["start"] else ""
    return f"⟦doc {span['document']}{where} | dataset {dataset}⟧"


def format_sample(result: dict) -> str:
    """A header naming the source and spans, then the text (or ids) with a marker at every
    document boundary."""
    spans = result["spans"]
    lines = [
        f"{result['split']} sample {result['index']:,} of {result['samples']:,}: dataset "
        f"{result['dataset']} ({result['prefix']}), its sample {result['dataset_sample']:,} "
        f"(built sample {result['built_sample']:,}), {result['num_tokens']} tokens",
        "spans: " + ", ".join(f"doc {s['document']} [{s['start']}:{s['stop']})"
                              for s in spans),
    ]
    body = []
    offset = 0
    for number, span in enumerate(spans):
        count = span["stop"] - span["start"]
        content = span.get("text")
        if content is None:
            content = " ".join(map(str, result["tokens"][offset : offset + count]))
        # the marker on a line of its own: text after it starts where the document does
        body.append(f"{_marker(span, result['dataset'], number == 0)}\n{content}")
        offset += count
    lines.append("\n".join(body))
    return "\n".join(lines)
