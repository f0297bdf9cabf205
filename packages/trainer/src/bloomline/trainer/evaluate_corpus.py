"""Which corpus, split and blend ``trainer evaluate`` scores: the run's own corpus (or a copy
of it) as the run's validation does, or any other corpus of the same tokenizer, per dataset.

- **The run's corpus** (no ``--data``, or ``--data`` with the same datasets: the same names
  and, where the run's ``data.corpus`` still exists, the same ``.idx`` bytes): its index is
  opened as the run opened it (``data.weights``, ``data.split``, ``data.seed``) and the
  default split is ``valid``, the share the run never trained on.
- **Another corpus** (a held-out set): the run's ``data.weights`` name the run's datasets, so
  they cannot apply; each dataset of the given corpus is scored on its own and the blend is
  by size (one epoch of each). The default split is ``all``: the whole corpus (its datasets'
  every document, one epoch), since a held-out corpus was never trained on and its
  ``data.split`` valid share would be a few percent of it. ``--split valid|test`` still
  scores that share.

Either way the corpus is checked against the run's tokenizer first (its fingerprints, or the
ids of files without one: ``data/corpus_vocabulary.py``), and the choice is printed in one
line (:attr:`EvalData.note`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.errors import SettingError, UserError
from bloomline.dataprep import IndexRequest, build_sample_datasets
from bloomline.dataprep.fingerprint import (
    check_same_tokenizer,
    check_tokenizer_matches,
    corpus_prefixes,
)
from bloomline.dataprep.index_cache import file_identity
from bloomline.dataprep.tokenizer import load_tokenizer
from bloomline.trainer.checkpoint.tokenizer_copy import inference_tokenizer
from bloomline.trainer.config import Config
from bloomline.trainer.data import TokenSamples
from bloomline.trainer.data.corpus_vocabulary import check_unfingerprinted
from bloomline.trainer.dataprep_keys import DATAPREP_KEYS

__all__ = ["EVAL_SPLITS", "EvalData", "check_eval_tokens", "choose_eval_data",
           "open_eval_samples"]

EVAL_SPLITS = ("valid", "test", "all")
WHOLE = "1,0,0"  # the split shares that put every document in one split (``all``)


@dataclass(frozen=True)
class EvalData:
    """What ``trainer evaluate`` reads: the corpus folder, the split (valid, test, all), the
    blend weights (the run's, or None: by size), the index cache, and the line saying so."""

    corpus: str
    split: str
    weights: dict[str, float] | None
    cache_dir: str
    runs_corpus: bool
    note: str


def choose_eval_data(cfg: Config, corpus: str | None, split: str | None) -> EvalData:
    """The corpus, split and weights to score (module docstring), from the checkpoint's
    config, ``--data`` and ``--split`` (None: the default for that corpus).

    Raises:
        UserError: an unknown split, a corpus that is gone or has no token files, or one
            made by another tokenizer than the run's corpus.
    """
    if split is not None and split not in EVAL_SPLITS:
        raise UserError(f"--split {split}: expected one of {', '.join(EVAL_SPLITS)}")
    folder = corpus or cfg.data.corpus
    if not folder:  # the run names its files otherwise (data.data_path): read as it did
        if split == "all":
            raise UserError("--split all: give the corpus folder to score whole with --data")
        return EvalData("", split or "valid", cfg.data.weights, cfg.data.cache_dir, True,
                        f"the run's data, scored as the run's validation; scoring its "
                        f"{split or 'valid'} split (data.split {cfg.data.split})")
    names = list(corpus_prefixes(folder))
    if not names:
        raise UserError(f"--data {folder}: no NAME.idx token files there (a folder made by "
                        "dataprep tokenize)" if corpus else
                        f"data.corpus {folder}: no NAME.idx token files there")
    run_names = _run_names(cfg)
    same = corpus is None or _same_datasets(cfg, folder, names, run_names)
    _check_run_tokenizer(cfg, folder, same)
    chosen = split or ("valid" if same else "all")
    listed = ", ".join(names)
    if same:
        what = (f"{folder}: the run's datasets ({listed}), scored as the run's validation "
                "(each dataset's own split; the blend by size)")
    else:
        run = f"the run's: {', '.join(run_names)}" if run_names else "the run's are unknown"
        what = (f"{folder}: not the run's corpus (its datasets: {listed}; {run}); each "
                "dataset is scored on its own and the blend by size (the run's data.weights "
                "do not apply)")
    scope = (f"the whole corpus (--split all; --split valid for its data.split "
             f"{cfg.data.split} share)" if chosen == "all" else
             f"its {chosen} split (data.split {cfg.data.split})")
    cache = cfg.data.cache_dir if corpus is None else ""
    return EvalData(folder, chosen, cfg.data.weights if same else None, cache, same,
                    f"{what}; scoring {scope}")


def open_eval_samples(cfg: Config, data: EvalData) -> TokenSamples:
    """The samples of the chosen split; ``all`` is one epoch of every document of every
    dataset (the split shares 1,0,0, the blend by size).

    Raises:
        UserError: a split the index does not have (``data.split`` gives it no share).
    """
    whole = data.split == "all"
    request = IndexRequest(
        seq_length=cfg.data.seq_length,
        train_samples=None if whole else cfg.train.train_samples,
        split=WHOLE if whole else cfg.data.split, seed=cfg.data.seed,
        weights=None if whole else (data.weights or None))
    try:
        built = build_sample_datasets(data.corpus, request, cache_dir=data.cache_dir or None)
    except SettingError as err:  # dataprep's settings, worded as the trainer's keys
        raise err.named(DATAPREP_KEYS) from None
    key = "train" if whole else data.split
    if key not in built.splits:
        have = [s for s in ("valid", "test") if s in built.splits] + ["all"]
        raise UserError(f"--split {data.split}: the index of {data.corpus} has no {data.split} "
                        f"split (data.split {cfg.data.split!r} gives it no share); choose "
                        f"{' or '.join(have)}")
    return TokenSamples(built.splits[key], cfg.data.seq_length)


def _run_names(cfg: Config) -> list[str]:
    """The run's dataset names: its corpus's files where it still exists, else the names
    its ``data.weights`` give (none when it had no weights)."""
    if cfg.data.corpus and Path(cfg.data.corpus).is_dir():
        return list(corpus_prefixes(cfg.data.corpus))
    return list(cfg.data.weights)


def _same_datasets(cfg: Config, folder: str, names: list[str], run_names: list[str]) -> bool:
    """Whether ``folder`` holds the run's datasets: the same names and, where the run's corpus
    is still there to compare with, the same ``.idx`` bytes (a copy); where it is gone and
    the run had no weights, a corpus is taken as the copy ``--data`` has always meant."""
    if not run_names:
        return True
    if sorted(names) != sorted(run_names):
        return False
    if not (cfg.data.corpus and Path(cfg.data.corpus).is_dir()):
        return True
    ours, theirs = corpus_prefixes(folder), corpus_prefixes(cfg.data.corpus)
    return all(file_identity(f"{ours[n]}.idx") == file_identity(f"{theirs[n]}.idx")
               for n in names)


def _check_run_tokenizer(cfg: Config, folder: str, same: bool) -> None:
    """Refuse a corpus another tokenizer made than the run's corpus: its files and the run's
    (where the run's corpus is still there) must share one fingerprint. The run's
    ``data.tokenizer`` is checked against it when the model is settled."""
    if same or not (cfg.data.corpus and Path(cfg.data.corpus).is_dir()):
        return
    prefixes = {f"{cfg.data.corpus}/{n}": p for n, p in corpus_prefixes(cfg.data.corpus).items()}
    prefixes.update({f"{folder}/{n}": p for n, p in corpus_prefixes(folder).items()})
    check_same_tokenizer(prefixes)


def check_eval_tokens(cfg: Config, checkpoint: str | Path, data: EvalData, model_vocab: int,
                      log: Callable[[str], object] | None) -> None:
    """The scored corpus against the checkpoint's tokenizer (its copy, else
    ``data.tokenizer``): fingerprints must match it, files without one must hold ids below
    its vocabulary (``data/corpus_vocabulary.py``). Without a tokenizer to load, files
    without a fingerprint are held against the model's ``model_vocab`` embedding rows."""
    if not data.corpus:  # the run's own files, checked as the run checked them
        return
    spec = inference_tokenizer(checkpoint, cfg.data.tokenizer)
    prefixes = corpus_prefixes(data.corpus)
    if spec and (spec.startswith("tiktoken:") or Path(spec).exists()):
        tokenizer = load_tokenizer(spec, cfg.data.eod_token or None)
        check_tokenizer_matches(prefixes, tokenizer, "the run's tokenizer")
        eod_id = tokenizer.eod_id if tokenizer.has_eod else None
        check_unfingerprinted(prefixes, tokenizer.vocab_size, eod_id,
                              f"the run's tokenizer {spec}", log)
    else:
        check_unfingerprinted(prefixes, model_vocab, None,
                              f"the model's {model_vocab:,} embedding rows", log)
