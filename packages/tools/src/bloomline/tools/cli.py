"""The ``inspect-data`` command line: thin wrappers that parse flags and call the library.

Every subcommand is read-only on token files (``sample``, ``blend`` and ``plot`` build the
sample-index cache if it is missing, as the trainer would), prints a table or text for people
and, with ``--json``, one JSON document for scripts. Bad input is one ``error:`` line and exit
code 1 (:func:`bloomline.common.errors.exit_on_user_error`), never a traceback.
"""

from __future__ import annotations

import json
import sys

import typer

from bloomline.common.errors import UserError, exit_on_user_error
from bloomline.common.output_lock import output_lock
from bloomline.dataprep import DataArgs, IndexRequest, build_sample_datasets
from bloomline.dataprep.cli_app import command_line_app
from bloomline.dataprep.data_args import expand_data_path_argv
from bloomline.dataprep.tokenizer import TOKENIZER_SPEC_HELP
from bloomline.tools.blend_report import format_blend, summarize_blend
from bloomline.tools.diff import diff_token_files, format_diff
from bloomline.tools.documents import format_document, show_document
from bloomline.tools.index_options import with_index_request
from bloomline.tools.plot import check_plot_output, plot_corpus, require_matplotlib
from bloomline.tools.samples import describe_sample, format_sample, split_dataset
from bloomline.tools.summary import format_summary, summarize
from bloomline.tools.token_stats import count_tokens, format_token_stats
from bloomline.tools.verify import format_verify, verify_corpus
from bloomline.tools.vocab import Vocabulary

app = command_line_app(
    "inspect-data", "bloomline-tools",
    help="Offline, read-only inspection of .bin/.idx corpora and their sample orders.",
    pretty_exceptions_enable=False,
)

_JSON = typer.Option(False, "--json", help="Print one JSON document instead of text.")
_TOKENIZER = typer.Option(
    None, help=f"Tokenizer to decode with: {TOKENIZER_SPEC_HELP} (default: ids).")
_CORPUS_HELP = ("Folder of NAME.bin/.idx token files; or name them with --data-path, "
                "--data-args-path or --per-split-data-args-path instead.")
_FROM = typer.Option("train", "--from",
                     help="Split to read: train, valid or test (--split gives their shares).")


def _echo(result: dict, as_json: bool, formatter) -> None:
    typer.echo(json.dumps(result, indent=1, ensure_ascii=False) if as_json
               else formatter(result))


def _vocabulary(model: str | None):
    return Vocabulary(model) if model else None


def _built(corpus_dir: str | DataArgs, request: IndexRequest, cache_dir: str | None):
    # the trainer's own call: builds the cache entries if missing, reuses them otherwise
    return build_sample_datasets(corpus_dir, request, cache_dir=cache_dir)


@app.command()
def summary(
    path: str = typer.Argument(..., help="Token file prefix corpus/NAME, or a corpus folder."),
    json_output: bool = _JSON,
) -> None:
    """Documents, tokens, dtype, largest id, length percentiles, sizes, format check.

    Exit 1 when the format check fails (the summary is still printed).
    """
    result = summarize(path)
    _echo(result, json_output, format_summary)
    if not result["ok"]:
        failed = next(row["format"] for row in result["datasets"].values()
                      if row["format"] != "ok")
        raise UserError(failed)


@app.command()
def verify(
    path: str = typer.Argument(..., help="Token file prefix corpus/NAME, or a corpus folder."),
    tokenizer: str = typer.Option(
        None, help=f"The corpus's tokenizer ({TOKENIZER_SPEC_HELP}): every token id must be "
        "below its vocabulary size."),
    cache_dir: str = typer.Option(
        None, help="Index cache to check (default: CORPUS_DIR/.index of a folder)."),
    json_output: bool = _JSON,
) -> None:
    """Full integrity check: exit 0, or the reason and exit 1.

    Checks the header, token dtype, index and .bin sizes, offsets, document boundaries, every
    token id against the vocabulary of --tokenizer (without it the largest id is reported),
    and for a corpus folder every entry of its index cache against the files.
    """
    vocab = _vocabulary(tokenizer)
    try:
        result = verify_corpus(path, vocab.vocab_size if vocab else None,
                               vocab.model_path if vocab else None, cache_dir)
    except UserError as err:
        if json_output:  # scripts get the verdict on stdout too
            typer.echo(json.dumps({"path": path, "ok": False, "error": str(err)}, indent=1))
        raise
    _echo(result, json_output, format_verify)


@app.command()
def show(
    prefix: str = typer.Argument(..., help="Token file prefix corpus/NAME."),
    doc: int = typer.Option(..., help="Document number (0-based, empty documents count)."),
    tokenizer: str = _TOKENIZER,
    json_output: bool = _JSON,
) -> None:
    """Decode document N (or print its token ids without --tokenizer)."""
    _echo(show_document(prefix, doc, _vocabulary(tokenizer)), json_output, format_document)


@app.command()
@with_index_request
def sample(
    corpus_dir: str = typer.Argument(None, help=_CORPUS_HELP),
    index: int = typer.Option(..., help="Sample number K in the order the trainer reads."),
    from_split: str = _FROM,
    tokenizer: str = _TOKENIZER,
    json_output: bool = _JSON,
    request: IndexRequest = None,
    cache_dir: str = None,
) -> None:
    """Sample K exactly as the trainer reads it, document boundaries marked.

    Prints the L+1 tokens (decoded with --tokenizer), the dataset of the blend it comes from
    and its sample number there, and the documents and offsets it spans. Takes the options of
    `dataprep build-index` and uses (or builds) the same index cache.
    """
    vocab = _vocabulary(tokenizer)
    split_ds, names = split_dataset(_built(corpus_dir, request, cache_dir), from_split,
                                    request.split)
    _echo(describe_sample(split_ds, names, index, from_split, vocab), json_output,
          format_sample)


@app.command()
@with_index_request
def blend(
    corpus_dir: str = typer.Argument(None, help=_CORPUS_HELP),
    from_split: str = _FROM,
    json_output: bool = _JSON,
    request: IndexRequest = None,
    cache_dir: str = None,
) -> None:
    """Requested vs realized share per dataset over training; epochs and repeats.

    Shares over the first 1%, 10%, 50% and all of the split's samples; epochs of each
    dataset; the most and mean times a document is read and the share never read. Takes the
    options of `dataprep build-index` and uses (or builds) the same index cache.
    """
    built = _built(corpus_dir, request, cache_dir)
    _echo(summarize_blend(built, from_split, request.split), json_output, format_blend)


@app.command()
def tokens(
    prefix: str = typer.Argument(..., help="Token file prefix corpus/NAME."),
    tokenizer: str = typer.Option(
        ..., help=f"The file's tokenizer ({TOKENIZER_SPEC_HELP})."),
    top: int = typer.Option(20, help="How many of the most frequent tokens to list."),
    json_output: bool = _JSON,
) -> None:
    """Most frequent tokens, byte-fallback rate, EOD count, unused share of the vocabulary."""
    _echo(count_tokens(prefix, _vocabulary(tokenizer), top), json_output, format_token_stats)


@app.command()
def diff(
    prefix_a: str = typer.Argument(..., help="First token file prefix."),
    prefix_b: str = typer.Argument(..., help="Second token file prefix."),
    json_output: bool = _JSON,
) -> None:
    """First differing document and token position, or "identical".

    Exit 0 when identical, 1 when different (as cmp does).
    """
    result = diff_token_files(prefix_a, prefix_b)
    _echo(result, json_output, format_diff)
    if not result["identical"]:
        raise typer.Exit(1)


@app.command()
@with_index_request
def plot(
    corpus_dir: str = typer.Argument(None, help=_CORPUS_HELP),
    out: str = typer.Option(..., help="Output .png (or .svg) file."),
    from_split: str = _FROM,
    overwrite: bool = typer.Option(False, help="Replace an existing PNG/SVG (nothing else)."),
    json_output: bool = _JSON,
    request: IndexRequest = None,
    cache_dir: str = None,
) -> None:
    """PNG: document-length histogram (log scale) and blend shares over training.

    Needs the plot extra: pip install 'bloomline-tools[plot]'. Takes the options of
    `dataprep build-index` and uses (or builds) the same index cache.
    """
    require_matplotlib()  # before the index is built: fail in a second, not after minutes
    with output_lock(out):  # one writer of --out at a time
        check_plot_output(out, overwrite)  # as early, for the same reason
        built = _built(corpus_dir, request, cache_dir)
        result = plot_corpus(corpus_dir, built, out, from_split, request.split, overwrite)
    _echo(result, json_output,
          lambda r: f"wrote {r['out']}: {', '.join(r['datasets'])}, {r['split']} split"
          + (f"; left out (weight 0): {', '.join(r['left_out'])}" if r["left_out"] else ""))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 1."""
    # Megatron's `--data-path W1 P1 W2 P2` as the repeated option click reads
    argv = expand_data_path_argv(sys.argv[1:] if argv is None else argv)
    exit_on_user_error(lambda: app(args=argv, prog_name="inspect-data"))


if __name__ == "__main__":
    sys.exit(main())
