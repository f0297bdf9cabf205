"""The ``dataprep`` command line: thin wrappers that parse flags and call the library."""

from __future__ import annotations

import json
import os
import sys

import typer

from bloomline.common.errors import UserError, exit_on_user_error
from bloomline.common.output_lock import output_lock, output_locks
from bloomline.dataprep.blend_phases import parse_phase
from bloomline.dataprep.build_index import (
    IndexRequest,
    format_report,
    parse_weights,
)
from bloomline.dataprep.cli_app import command_line_app
from bloomline.dataprep.data_args import choose_source, expand_data_path_argv
from bloomline.dataprep.data_args_build import build_sample_datasets
from bloomline.dataprep.demo_corpus import write_demo_corpus
from bloomline.dataprep.formats import SUPPORTED_SUFFIXES
from bloomline.dataprep.indexed_dataset import IndexedDataset, merge_indexed_datasets
from bloomline.dataprep.sharding import check_shard_parts, format_merge_summary, parse_shard
from bloomline.dataprep.tokenize_corpus import output_prefix, output_prefixes, tokenize_corpus
from bloomline.dataprep.tokenizer import TOKENIZER_SPEC_HELP
from bloomline.dataprep.tokenizer.training import train_tokenizer_run
from bloomline.dataprep.tokenizer.training_summary import (
    format_training_summary,
    summarize_training,
)

app = command_line_app(
    "dataprep", "bloomline-dataprep",
    help="bloomline dataprep: raw corpora to Megatron-compatible token files.",
    pretty_exceptions_enable=False,
)


@app.command("demo-corpus")
def demo_corpus(
    out_dir: str = typer.Argument(..., help="Folder for NAME.jsonl.zst."),
    size_mb: float = typer.Option(3.0, help="MB of text to write (1 MB = 1e6 bytes)."),
    name: str = typer.Option("stdlib_docs", help="File stem of the output."),
    overwrite: bool = typer.Option(False, help="Replace an existing output."),
) -> None:
    """Write a deterministic corpus of real text (Python stdlib docstrings and comments)."""
    try:
        summary = write_demo_corpus(out_dir, size_mb=size_mb, name=name, overwrite=overwrite)
    except (FileExistsError, ValueError) as err:
        raise UserError(str(err)) from None
    typer.echo(f"wrote {summary.path}: {summary.num_documents:,} documents, "
               f"{summary.num_text_bytes / 1e6:.2f} MB of text")


@app.command("train-tokenizer")
def train_tokenizer(
    inputs: list[str] = typer.Argument(..., help="Files, globs or folders of raw text."),
    vocab_size: int = typer.Option(..., help="Number of pieces, special tokens included."),
    output: str = typer.Option(
        ..., help="sentencepiece: prefix DIR/NAME, writes NAME.model/.vocab; byte-bpe: a "
        "folder, gets tokenizer.json and tokenizer_config.json."),
    kind: str = typer.Option(
        "sentencepiece", help="sentencepiece, or byte-bpe (BLOOM-style byte-level BPE, a "
        "Hugging Face tokenizer.json)."),
    model_type: str = typer.Option("bpe", help="sentencepiece only: bpe or unigram."),
    character_coverage: float = typer.Option(
        None, help="sentencepiece only: the share of the sample's characters that get a piece "
        "of their own; the rarest rest is spelled in byte pieces. 0.98 to 1.0, default 0.9999. "
        "It matters for Chinese and Japanese, whose thousands of rare characters would take "
        "vocabulary entries: SentencePiece advises 0.9995 for them, 1.0 for small alphabets. "
        "The summary says what it gave."),
    json_key: list[str] = typer.Option(["text"], help="JSON field(s) holding the text."),
    max_sentences: int = typer.Option(
        1_000_000, help="Lines sampled (uniformly) for training; bounds memory."),
    txt_per_line: bool = typer.Option(False, help="Each line of a .txt file is a document."),
    skip_bad_lines: bool = typer.Option(False, help="Count and skip bad lines."),
    seed: int = typer.Option(0, help="Seed of the line sample."),
    overwrite: bool = typer.Option(False, help="Replace an existing model."),
    quiet: bool = typer.Option(False, help="No progress lines on stderr."),
) -> None:
    """Train a tokenizer: SentencePiece (byte fallback) or a BLOOM-style byte-level BPE, with
    <unk> 0, <s> 1, </s> 2 (EOD), <pad> 3. Progress on stderr while reading; at the end the
    vocabulary, its coverage of the sample's characters and the time."""
    trained = train_tokenizer_run(
        inputs, output, vocab_size, kind=kind, model_type=model_type, keys=tuple(json_key),
        max_sentences=max_sentences, character_coverage=character_coverage,
        txt_per_line=txt_per_line, skip_bad_lines=skip_bad_lines, seed=seed,
        overwrite=overwrite, show_progress=not quiet)
    typer.echo(f"wrote {trained.path}")
    typer.echo(format_training_summary(summarize_training(trained)))


@app.command("tokenize")
def tokenize(
    inputs: list[str] = typer.Argument(
        ..., help=f"Files, globs or folders: {', '.join(SUPPORTED_SUFFIXES)}, save_to_disk "
        "dataset folders."),
    tokenizer: str = typer.Option(
        ..., help=f"The tokenizer: {TOKENIZER_SPEC_HELP}."),
    output: str = typer.Option(..., help="Output prefix corpus/NAME."),
    json_key: list[str] = typer.Option(
        ["text"], help="JSON field (or column) to tokenize; repeat for one output per key "
        "(NAME_KEY)."),
    workers: int = typer.Option(
        os.cpu_count() or 1, help="Tokenizer processes (default: one per core)."),
    append_eod: bool = typer.Option(True, help="Append the EOD token to each document."),
    eod_token: str = typer.Option(
        None, help="The token that ends documents, when the tokenizer does not say (default: "
        "eos of the model / tokenizer_config.json, or a well-known end-of-text token)."),
    overwrite: bool = typer.Option(False, help="Replace existing outputs."),
    skip_bad_lines: bool = typer.Option(
        False, help="Count and skip bad lines instead of stopping at the first."),
    txt_per_line: bool = typer.Option(False, help="Each line of a .txt file is a document."),
    chunk_mb: float = typer.Option(
        8.0, help="Most input MiB per unit of work (less for small inputs and near the end)."),
    max_document_mb: float = typer.Option(
        64.0, help="Most MiB one line (document) may hold; a longer one is a bad line. "
        "Tokenizers need many times a document's size in memory."),
    quiet: bool = typer.Option(False, help="No progress line."),
    shard: str = typer.Option(
        None, metavar="K/N", help="Tokenize only part K (0..N-1) of N deterministic parts of "
        "the inputs (one per SLURM array task); `dataprep merge` of the N outputs in order "
        "gives the single run's bytes."),
    ray: str = typer.Option(
        None, metavar="[ADDRESS]", help="Run the chunks as Ray tasks: on the cluster at "
        "ADDRESS (HOST:PORT, ray://HOST:PORT, auto), or on a Ray instance started here when "
        "ADDRESS is left out. Inputs, tokenizer and output must be on a filesystem every node "
        "sees."),
) -> None:
    """Tokenize corpora into Megatron-compatible NAME.bin/NAME.idx."""
    output = _output_prefix(output)
    shard_part = parse_shard(shard) if shard is not None else None  # refused before the lock
    # one writer per output for the whole run: the token files, then their records
    with output_locks(output_prefixes(output, json_key).values()):
        summary = tokenize_corpus(
            inputs, tokenizer, output, keys=json_key, workers=workers,
            append_eod=append_eod, overwrite=overwrite, skip_bad_lines=skip_bad_lines,
            txt_per_line=txt_per_line,
            max_chunk_bytes=max(1, int(chunk_mb * (1 << 20))), show_progress=not quiet,
            eod_token=eod_token, shard=shard_part,
            ray_address=ray, max_document_bytes=max(1, int(max_document_mb * (1 << 20))))
    for message in summary.skipped_messages:
        typer.echo(f"skipped: {message}", err=True)
    typer.echo(summary.format())


@app.command("merge")
def merge(
    prefixes: list[str] = typer.Argument(..., help="Input prefixes, in output order."),
    output: str = typer.Option(..., help="Output prefix corpus/NAME."),
    overwrite: bool = typer.Option(False, help="Replace an existing output."),
) -> None:
    """Concatenate token files (same dtype) into one .bin/.idx pair. The N parts of a
    `tokenize --shard K/N` job, given in shard order, give the single run's bytes."""
    output = _output_prefix(output)
    # checked before anything is written: parts of one job, each once, in shard order
    counts = [IndexedDataset(prefix).num_documents for prefix in prefixes]
    parts = check_shard_parts(prefixes, counts)
    with output_lock(output):  # one writer of the output: the pair, then its fingerprint
        merged = merge_indexed_datasets(prefixes, output, overwrite=overwrite)
    typer.echo(f"wrote {output}.bin/.idx: {merged.num_documents:,} documents, "
               f"{merged.num_tokens:,} tokens")
    if parts:
        typer.echo(format_merge_summary(parts))


@app.command("build-index")
def build_index(
    corpus_dir: str = typer.Argument(
        None, help="Folder of NAME.bin/.idx token files (all used); or name them with "
        "--data-path, --data-args-path or --per-split-data-args-path instead."),
    seq_length: int = typer.Option(..., help="L: tokens per sample (samples hold L+1)."),
    train_samples: int = typer.Option(..., help="Training samples to serve."),
    valid_samples: int = typer.Option(
        None, help="Validation samples (default: one epoch of the valid split)."),
    test_samples: int = typer.Option(
        None, help="Test samples (default: one epoch of the test split)."),
    split: str = typer.Option(
        None, help="train,valid,test shares of each dataset (default 969,30,1; none with "
        "--per-split-data-args-path)."),
    seed: int = typer.Option(1234, help="Seed of the shuffles (Megatron's --seed)."),
    weight: list[str] = typer.Option(
        None, help="NAME=W blend weight, one per dataset; 0 leaves the dataset out (default: "
        "by size, one epoch each)."),
    phase: list[str] = typer.Option(
        None, help="START:NAME=W,... blend weights from train sample START on (repeatable, "
        "starts increasing); --weight gives the first phase's."),
    data_path: list[str] = typer.Option(
        None, help="Megatron's --data-path: PREFIX [PREFIX ...] or W1 PREFIX1 W2 PREFIX2 ... "
        "(PREFIX.bin/.idx anywhere; one string or several words), cut by --split."),
    data_args_path: str = typer.Option(None, help="A file holding --data-path's words."),
    per_split_data_args_path: str = typer.Option(
        None, help='JSON {"train": [...], "valid": [...], "test": [...]}: each split\'s own '
        "blend (--data-path's forms), each dataset used whole (no --split)."),
    cache_dir: str = typer.Option(
        None, "--cache-dir", "--data-cache-path", help="Index cache (default: CORPUS_DIR/.index, "
        "or .index beside the first --data-path prefix; --data-cache-path is Megatron's name)."),
    surplus: float = typer.Option(
        0.005, help="Extra share of samples built per blended dataset (Megatron's "
        "mid_level_dataset_surplus)."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Build (or reuse) Megatron-identical sample indices and blends for every split."""
    source, split = choose_source(corpus_dir, split, data_path or (), data_args_path,
                                  per_split_data_args_path)
    request = IndexRequest(
        seq_length=seq_length, train_samples=train_samples, valid_samples=valid_samples,
        test_samples=test_samples, split=split, seed=seed,
        weights=parse_weights(weight) if weight else None, surplus=surplus,
        phases=tuple(parse_phase(value) for value in phase or ()))
    built = build_sample_datasets(source, request, cache_dir=cache_dir)
    typer.echo(json.dumps(built.report, indent=1) if json_output else
               format_report(built.report))


def _output_prefix(output: str) -> str:
    """``--output corpus/NAME.idx`` (or ``.bin``) means the pair ``corpus/NAME.bin/.idx``: the
    prefix without the suffix, said on stderr (the writer already dropped it, while the
    records beside the pair and the messages kept it)."""
    prefix = output_prefix(output)
    if prefix != output:
        typer.echo(f"note: --output {output}: writing {prefix}.bin/.idx (the prefix without "
                   f"{output[len(prefix):]})", err=True)
    return prefix


def _ray_address_optional(argv: list[str]) -> list[str]:
    """``--ray`` with its ADDRESS left out means "local": click options need a value, so a
    bare ``--ray`` gets "local" unless the next word looks like an address."""
    out = []
    for position, word in enumerate(argv):
        out.append(word)
        if word != "--ray":
            continue
        following = argv[position + 1] if position + 1 < len(argv) else ""
        if not (":" in following or following in ("auto", "local")):
            out.append("local")
    return out


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 1."""
    argv = expand_data_path_argv(_ray_address_optional(sys.argv[1:]))
    exit_on_user_error(lambda: app(args=argv, prog_name="dataprep"))


if __name__ == "__main__":
    sys.exit(main())
