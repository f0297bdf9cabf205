"""Train a tokenizer from the same readers as ``tokenize``, in bounded memory.

Both kinds learn from a uniform sample of at most ``max_sentences`` lines of the inputs (one
pass, reservoir sampling), so memory does not grow with the corpus.

- ``sentencepiece`` (``--kind sentencepiece``, the default): a SentencePiece BPE or unigram
  model that keeps text exactly (identity normalization, whitespace kept) and falls back to
  bytes for unseen characters. Writes ``OUTPUT.model`` and ``OUTPUT.vocab``.
- ``byte-bpe``: a byte-level BPE with the ``tokenizers`` library, laid out like BLOOM's
  tokenizer (its pre-tokenizer split, byte-level alphabet, no normalizer). Every byte string
  has a spelling, so nothing is ever unknown. Writes the folder ``OUTPUT/`` with
  ``tokenizer.json`` and a ``tokenizer_config.json`` naming the special tokens (what
  ``AutoTokenizer`` and ``--tokenizer OUTPUT`` read).

Both use the special ids of BLOOM's config: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (EOD), ``<pad>`` 3.

Both refuse, writing nothing, when the text yields fewer entries than ``--vocab-size`` asks
(a byte-level BPE runs out of pairs to merge; SentencePiece refuses the same way): the line
says how many it yields, so that the next run asks for what the text can give or adds text.

``character_coverage`` (``--character-coverage``, SentencePiece only) is the share of the
sample's characters that get a piece of their own, the rarest rest being spelled in byte pieces:
0.98 to 1.0, 0.9999 unless given. :func:`train_tokenizer_run` also returns the sample and the
times, which :mod:`.training_summary` turns into the command's summary (vocabulary, coverage,
time); with ``show_progress`` the reading pass prints a progress line on stderr.

Outputs: one run at a time per ``--output`` (``bloomline.common.output_lock``, held from the
exists-check to the last rename). ``--overwrite`` replaces only this command's own output:
the byte-bpe folder only when it holds ``tokenizer.json`` + ``tokenizer_config.json`` and
nothing else (``check_replaceable_dir``: never an export or a run folder, whose
``tokenizer.model`` would be left disagreeing with the new ``tokenizer.json``), swapped as a
whole folder; the SentencePiece pair only when both files are SentencePiece files, and never
beside a Hugging Face ``tokenizer.json`` it would disagree with. Neither is written into a
checkpoint, a run folder or a corpus folder.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.atomic import (
    atomic_output_dir,
    check_not_inside_foreign,
    check_replaceable_dir,
    check_replaceable_file,
    publish_dir,
    publish_new,
)
from bloomline.common.errors import UserError
from bloomline.common.output_lock import output_lock
from bloomline.common.progress import BYTES, Counter, Progress
from bloomline.dataprep.documents import extract_documents
from bloomline.dataprep.sources import expand_inputs, iter_chunks

__all__ = ["DEFAULT_CHARACTER_COVERAGE", "SPECIAL_TOKENS", "TOKENIZER_KINDS", "TrainedTokenizer",
           "train_tokenizer", "train_tokenizer_run"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
TOKENIZER_KINDS = ("sentencepiece", "byte-bpe")
DEFAULT_CHARACTER_COVERAGE = 0.9999
# the values SentencePiece's trainer accepts
_COVERAGE_RANGE = (0.98, 1.0)
# SentencePiece skips training "sentences" longer than this many bytes; documents are split
# into lines and long lines into pieces of at most this size so none is silently dropped.
_MAX_SENTENCE_BYTES = 4192
# BLOOM's pre-tokenizer: words with their leading space, punctuation (Latin, CJK, Devanagari,
# Arabic) on its own; whitespace runs are kept (isolated), so text round-trips exactly
_BLOOM_SPLIT = " ?[^(\\s|[.,!?…。，、।۔،])]+"
# SentencePiece's refusal of a vocabulary larger than the text yields
_SENTENCEPIECE_TOO_FEW = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a "
                                    r"value <= (\d+)")
# what the byte-bpe folder holds, all of it (--overwrite replaces only such a folder)
_BYTE_BPE_FILES = ("tokenizer.json", "tokenizer_config.json")
# how SentencePiece's files start: the ModelProto's first field (its pieces, field 1,
# length-delimited: byte 0x0a), and the .vocab's first line, piece 0 (always <unk> here)
_SENTENCEPIECE_SIGNATURES = {".model": (b"\n",), ".vocab": (b"<unk>\t",)}


@dataclass
class TrainedTokenizer:
    """What :func:`train_tokenizer_run` did: the output, the sample it learned from (the
    training "sentences"), how many lines it read, and its times in seconds."""

    path: Path
    kind: str
    model_type: str
    character_coverage: float | None
    sentences: list[str]
    lines_read: int
    seconds_reading: float
    seconds_training: float


def _training_sentences(inputs: list[str], keys: list[str], txt_per_line: bool,
                        skip_bad_lines: bool, progress: Progress) -> Iterator[str]:
    sources = expand_inputs(inputs)
    progress.total = sum(s.work_bytes for s in sources) or None
    for chunk in iter_chunks(sources, txt_per_line=txt_per_line):
        docs = extract_documents(chunk, keys, skip_bad_lines)
        lines = text_bytes = 0
        for texts in docs.texts.values():
            for text in texts:
                for line in text.split("\n"):
                    if not line.strip():
                        continue
                    raw = line.encode("utf-8")
                    lines += 1
                    text_bytes += len(raw)
                    for start in range(0, len(raw), _MAX_SENTENCE_BYTES):
                        piece = raw[start : start + _MAX_SENTENCE_BYTES]
                        yield piece.decode("utf-8", errors="ignore")
        progress.update(source_bytes=chunk.source_bytes, lines=lines, text_bytes=text_bytes)


def _reservoir(items: Iterator[str], size: int, seed: int) -> list[str]:
    """A uniform sample of ``size`` items in one pass and O(size) memory (Algorithm R)."""
    rng = random.Random(seed)
    sample: list[str] = []
    for seen, item in enumerate(items):
        if seen < size:
            sample.append(item)
        else:
            slot = rng.randint(0, seen)
            if slot < size:
                sample[slot] = item
    return sample


def train_tokenizer(inputs: list[str], output: str | os.PathLike, vocab_size: int,
                    **options) -> Path:
    """Train a tokenizer (see the module docstring) on a sample of the inputs; ``options``
    are :func:`train_tokenizer_run`'s.

    Returns:
        What ``--tokenizer`` takes: ``OUTPUT.model`` (sentencepiece) or the folder ``OUTPUT``
        (byte-bpe).
    """
    return train_tokenizer_run(inputs, output, vocab_size, **options).path


def train_tokenizer_run(
    inputs: list[str],
    output: str | os.PathLike,
    vocab_size: int,
    kind: str = "sentencepiece",
    model_type: str = "bpe",
    keys: tuple[str, ...] = ("text",),
    max_sentences: int = 1_000_000,
    character_coverage: float | None = None,
    txt_per_line: bool = False,
    skip_bad_lines: bool = False,
    seed: int = 0,
    num_threads: int | None = None,
    overwrite: bool = False,
    show_progress: bool = False,
) -> TrainedTokenizer:
    """Train a tokenizer of ``kind`` (see the module docstring) on a sample of the inputs.

    Raises:
        UserError: an unknown kind, a vocabulary too small, a character coverage out of
            range or given to a byte-level BPE, outputs that exist without ``overwrite``,
            no text, or the trainer refusing (one line).
    """
    if kind not in TOKENIZER_KINDS:
        raise UserError(f"--kind {kind}: expected one of {', '.join(TOKENIZER_KINDS)}")
    if vocab_size < 300:
        raise UserError(f"--vocab-size {vocab_size}: must be at least 300 (256 bytes, the "
                        "special tokens and some merges)")
    character_coverage = _checked_coverage(kind, character_coverage)
    progress = Progress("train-tokenizer: reading",
                        [Counter("lines", "lines"), Counter("text_bytes", BYTES)],
                        total_key="source_bytes", enabled=show_progress)
    with output_lock(output):  # one run per --output, whichever kind
        if kind == "sentencepiece":
            trained = _train_sentencepiece(inputs, output, vocab_size, model_type, keys,
                                           max_sentences, character_coverage, txt_per_line,
                                           skip_bad_lines, seed, num_threads, overwrite,
                                           progress)
        else:
            trained = _train_byte_bpe(inputs, Path(output), vocab_size, keys, max_sentences,
                                      txt_per_line, skip_bad_lines, seed, overwrite, progress)
    trained.lines_read = int(progress.values["lines"])
    trained.seconds_training = progress.elapsed - trained.seconds_reading
    return trained


def _checked_coverage(kind: str, character_coverage: float | None) -> float | None:
    """SentencePiece's coverage (its default when None); None for a byte-level BPE."""
    if kind != "sentencepiece":
        if character_coverage is not None:
            raise UserError(f"--character-coverage {character_coverage}: for --kind "
                            "sentencepiece only; a byte-level BPE spells every character in "
                            "bytes")
        return None
    if character_coverage is None:
        return DEFAULT_CHARACTER_COVERAGE
    low, high = _COVERAGE_RANGE
    if not low <= character_coverage <= high:
        raise UserError(f"--character-coverage {character_coverage}: SentencePiece takes "
                        f"{low} to {high} (0.9995 for Chinese or Japanese, 1.0 for small "
                        "alphabets)")
    return character_coverage


def _sample_sentences(inputs, keys, max_sentences, txt_per_line, skip_bad_lines, seed,
                      progress: Progress, training: str) -> tuple[list[str], float]:
    """The sample and the seconds its reading took; ``training`` (what is trained next) is
    said on stderr with the progress, as the trainers print nothing until they are done."""
    sentences = _reservoir(
        _training_sentences(inputs, list(keys), txt_per_line, skip_bad_lines, progress),
        max_sentences, seed)
    show = progress.enabled
    progress.close()
    if not sentences:
        raise UserError(f"{' '.join(inputs)}: no text to train a tokenizer on")
    if show:
        print(f"train-tokenizer: training {training} on {len(sentences):,} sampled lines "
              "(no progress until it is done)", file=sys.stderr, flush=True)
    return sentences, progress.elapsed


def _too_few_entries(yielded: int, asked: int, sentences: list[str], max_sentences: int
                     ) -> UserError:
    """The one line for a text that yields fewer vocabulary entries than asked."""
    sample = (f"; the sample is capped at --max-sentences {max_sentences} lines: raise it"
              if len(sentences) >= max_sentences else "")
    return UserError(f"train-tokenizer: the text yields only {yielded:,} vocabulary entries, "
                     f"--vocab-size {asked} asked; give more text or --vocab-size {yielded} or "
                     f"less{sample} (nothing written)")


def _train_byte_bpe(inputs: list[str], output: Path, vocab_size: int, keys: tuple[str, ...],
                    max_sentences: int, txt_per_line: bool, skip_bad_lines: bool, seed: int,
                    overwrite: bool, progress: Progress) -> TrainedTokenizer:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    _check_byte_bpe_output(output, overwrite)
    sentences, reading = _sample_sentences(
        inputs, keys, max_sentences, txt_per_line, skip_bad_lines, seed, progress,
        f"a byte-level BPE of {vocab_size:,} entries")
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_BLOOM_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True,
                                           use_regex=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=False)
    tokenizer.train_from_iterator(sentences, trainer=trainer, length=len(sentences))
    # the trainer stops early, silently, when no pair is left to merge
    if tokenizer.get_vocab_size() < vocab_size:
        raise _too_few_entries(tokenizer.get_vocab_size(), vocab_size, sentences, max_sentences)
    unk, bos, eos, pad = SPECIAL_TOKENS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": unk,
              "bos_token": bos, "eos_token": eos, "pad_token": pad,
              "model_max_length": 1_000_000_000, "add_prefix_space": False}
    with atomic_output_dir(output.parent, output.name) as scratch:
        staged = scratch / "tokenizer"
        staged.mkdir()  # inside the 0700 scratch folder: gets the umask's ordinary mode
        tokenizer.save(str(staged / "tokenizer.json"))
        (staged / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        _check_byte_bpe_output(output, overwrite)  # again: what appeared while training
        publish_dir(staged, output, scratch)
    return TrainedTokenizer(output, "byte-bpe", "bpe", None, sentences, 0, reading, 0.0)


def _check_byte_bpe_output(output: Path, overwrite: bool) -> None:
    """Refuse a byte-bpe ``--output`` other than nothing, an empty folder or an earlier
    byte-bpe output (with ``overwrite``), in one line."""
    check_not_inside_foreign(output)
    check_replaceable_dir(output, overwrite, "byte-bpe tokenizer", _BYTE_BPE_FILES)


def _check_sentencepiece_output(model_path: Path, vocab_path: Path, overwrite: bool) -> None:
    """Refuse a SentencePiece pair that would replace anything but an earlier pair, or sit
    beside a Hugging Face tokenizer (or in a checkpoint, run or corpus folder), in one line."""
    folder = model_path.parent
    if (folder / "tokenizer.json").exists():
        raise UserError(f"{model_path}: not written: {folder} holds a Hugging Face "
                        "tokenizer.json, which a SentencePiece model beside it would disagree "
                        "with; choose another output folder")
    for path in (model_path, vocab_path):
        check_replaceable_file(path, overwrite, "SentencePiece", _SENTENCEPIECE_SIGNATURES)


def _train_sentencepiece(
    inputs: list[str],
    output_prefix: str | os.PathLike,
    vocab_size: int,
    model_type: str,
    keys: tuple[str, ...],
    max_sentences: int,
    character_coverage: float,
    txt_per_line: bool,
    skip_bad_lines: bool,
    seed: int,
    num_threads: int | None,
    overwrite: bool,
    progress: Progress,
) -> TrainedTokenizer:
    """Train a SentencePiece model on a bounded uniform sample of the inputs' lines.

    The model keeps text exactly (identity normalization, whitespace kept) and falls back to
    bytes for unseen characters, so every input round-trips through encode/decode. Writes
    ``OUTPUT_PREFIX.model`` and ``.vocab`` beside it; the result's path is the ``.model``.
    """
    import sentencepiece as spm

    output_prefix = Path(output_prefix)
    model_path = output_prefix.with_name(output_prefix.name + ".model")
    vocab_path = output_prefix.with_name(output_prefix.name + ".vocab")
    if model_type not in ("bpe", "unigram"):
        raise UserError(f"--model-type {model_type}: expected 'bpe' or 'unigram'")
    _check_sentencepiece_output(model_path, vocab_path, overwrite)
    sentences, reading = _sample_sentences(
        inputs, keys, max_sentences, txt_per_line, skip_bad_lines, seed, progress,
        f"a SentencePiece {model_type} model of {vocab_size:,} entries")
    output_prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp_prefix = output_prefix.with_name(f".{output_prefix.name}.{os.getpid()}.partial")
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=iter(sentences),
            model_prefix=str(tmp_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            byte_fallback=True,
            character_coverage=character_coverage,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>", pad_piece="<pad>",
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,
        )
        _check_sentencepiece_output(model_path, vocab_path, overwrite)  # again: see byte-bpe
        if overwrite:
            os.replace(f"{tmp_prefix}.vocab", vocab_path)
            os.replace(f"{tmp_prefix}.model", model_path)
        else:  # never over a file that appeared since the check: the pair, or neither
            publish_new(f"{tmp_prefix}.vocab", vocab_path)
            try:
                publish_new(f"{tmp_prefix}.model", model_path)
            except BaseException:
                vocab_path.unlink(missing_ok=True)
                raise
    except RuntimeError as err:
        too_few = _SENTENCEPIECE_TOO_FEW.search(str(err))
        if too_few:
            raise _too_few_entries(int(too_few.group(2)), vocab_size, sentences,
                                   max_sentences) from None
        raise UserError(f"train-tokenizer: SentencePiece refused: {str(err).splitlines()[0]}"
                        ) from None
    finally:
        for suffix in (".model", ".vocab"):
            Path(f"{tmp_prefix}{suffix}").unlink(missing_ok=True)
    return TrainedTokenizer(model_path, "sentencepiece", model_type, character_coverage,
                            sentences, 0, reading, 0.0)
