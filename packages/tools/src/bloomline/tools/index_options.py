"""``dataprep build-index``'s options, declared once for every command that needs a sample order.

``sample``, ``blend`` and ``plot`` must see the samples the trainer will see, so they take
exactly the options ``dataprep build-index`` takes (same names, defaults and meaning) and build
or reuse the same cache entries. :func:`with_index_request` adds them to a typer command and
hands the command a ready :class:`IndexRequest` and ``cache_dir`` instead of nine parameters.
A test compares these options with ``dataprep build-index``'s, so the two cannot drift apart.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable

import typer

from bloomline.dataprep.blend_phases import parse_phase
from bloomline.dataprep.build_index import DEFAULT_SURPLUS, IndexRequest, parse_weights
from bloomline.dataprep.data_args import choose_source

__all__ = ["INDEX_OPTION_NAMES", "with_index_request"]

_KW = inspect.Parameter.KEYWORD_ONLY
_OPTIONS = [
    inspect.Parameter("seq_length", _KW, annotation=int, default=typer.Option(
        ..., help="L: tokens per sample (samples hold L+1).")),
    inspect.Parameter("train_samples", _KW, annotation=int, default=typer.Option(
        ..., help="Training samples to serve.")),
    inspect.Parameter("valid_samples", _KW, annotation=int, default=typer.Option(
        None, help="Validation samples (default: one epoch of the valid split).")),
    inspect.Parameter("test_samples", _KW, annotation=int, default=typer.Option(
        None, help="Test samples (default: one epoch of the test split).")),
    inspect.Parameter("split", _KW, annotation=str, default=typer.Option(
        None, help="train,valid,test shares of each dataset (default 969,30,1; none with "
        "--per-split-data-args-path).")),
    inspect.Parameter("seed", _KW, annotation=int, default=typer.Option(
        1234, help="Seed of the shuffles (Megatron's --seed).")),
    inspect.Parameter("weight", _KW, annotation=list[str], default=typer.Option(
        None, help="NAME=W blend weight, one per dataset; 0 leaves the dataset out (default: "
        "by size, one epoch each).")),
    inspect.Parameter("phase", _KW, annotation=list[str], default=typer.Option(
        None, help="START:NAME=W,... blend weights from train sample START on (repeatable, "
        "starts increasing); --weight gives the first phase's.")),
    inspect.Parameter("data_path", _KW, annotation=list[str], default=typer.Option(
        None, help="Megatron's --data-path: PREFIX [PREFIX ...] or W1 PREFIX1 W2 PREFIX2 ... "
        "(PREFIX.bin/.idx anywhere; one string or several words), cut by --split.")),
    inspect.Parameter("data_args_path", _KW, annotation=str, default=typer.Option(
        None, help="A file holding --data-path's words.")),
    inspect.Parameter("per_split_data_args_path", _KW, annotation=str, default=typer.Option(
        None, help='JSON {"train": [...], "valid": [...], "test": [...]}: each split\'s own '
        "blend (--data-path's forms), each dataset used whole (no --split).")),
    inspect.Parameter("cache_dir", _KW, annotation=str, default=typer.Option(
        None, "--cache-dir", "--data-cache-path", help="Index cache (default: CORPUS_DIR/.index, "
        "or .index beside the first --data-path prefix; --data-cache-path is Megatron's name).")),
    inspect.Parameter("surplus", _KW, annotation=float, default=typer.Option(
        DEFAULT_SURPLUS, help="Extra share of samples built per blended dataset (Megatron's "
        "mid_level_dataset_surplus).")),
]
INDEX_OPTION_NAMES = tuple(p.name for p in _OPTIONS)


def with_index_request(command: Callable) -> Callable:
    """Give a typer command ``dataprep build-index``'s options.

    The command declares ``corpus_dir``, ``request: IndexRequest`` and ``cache_dir: str |
    None`` among its parameters; typer sees the build-index options in their place, and the
    command is called with the request they describe and, as ``corpus_dir``, the folder or the
    datasets of ``--data-path`` / ``--data-args-path`` / ``--per-split-data-args-path``.
    """
    hints = typing.get_type_hints(command)
    own = [p.replace(annotation=hints.get(p.name, p.annotation))
           for p in inspect.signature(command).parameters.values()
           if p.name not in ("request", "cache_dir")]

    @functools.wraps(command)
    def wrapper(**kwargs):
        options = {name: kwargs.pop(name) for name in INDEX_OPTION_NAMES}
        # the corpus folder, or the datasets Megatron's data arguments name
        source, split = choose_source(kwargs.pop("corpus_dir"), options["split"],
                                      options["data_path"] or (), options["data_args_path"],
                                      options["per_split_data_args_path"])
        request = IndexRequest(
            seq_length=options["seq_length"], train_samples=options["train_samples"],
            valid_samples=options["valid_samples"], test_samples=options["test_samples"],
            split=split, seed=options["seed"],
            weights=parse_weights(options["weight"]) if options["weight"] else None,
            surplus=options["surplus"],
            phases=tuple(parse_phase(value) for value in options["phase"] or ()))
        return command(corpus_dir=source, request=request, cache_dir=options["cache_dir"],
                       **kwargs)

    parameters = own + _OPTIONS
    # typer reads the signature (inspect stops at __signature__) and the resolved annotations
    wrapper.__signature__ = inspect.Signature(parameters)
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper
