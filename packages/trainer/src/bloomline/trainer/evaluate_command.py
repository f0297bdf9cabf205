"""``trainer evaluate``: a checkpoint's loss and perplexity on a split of its run's data (or of
any corpus of its tokenizer: ``evaluate_corpus.py`` chooses what is read), in this process,
built as training builds a rank (``build.build_run``) and measured with the same per-sample
forward (the step runner's ``sample_losses``) and the same split evaluation
(``evaluation.evaluate_split``) as the loop's validation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch

from bloomline.common.errors import UserError
from bloomline.dataprep.data_args_build import describe
from bloomline.trainer.blend_phases import configured_phases
from bloomline.trainer.checkpoint import load_checkpoint, load_config_of
from bloomline.trainer.checkpoint.path_kind import checkpoint_to_read
from bloomline.trainer.config import Config
from bloomline.trainer.data import blend_of, open_splits
from bloomline.trainer.data.data_source import data_source, uses_data_args
from bloomline.trainer.evaluate_corpus import (
    EvalData,
    check_eval_tokens,
    choose_eval_data,
    open_eval_samples,
)
from bloomline.trainer.evaluation import SplitEvaluation, evaluate_split

__all__ = ["SPLITS", "evaluate_checkpoint"]

SPLITS = ("valid", "test")


def evaluate_checkpoint(checkpoint: str | Path, split: str | None = None,
                        num_samples: int | None = None, corpus: str | None = None,
                        log: Callable[[str], object] | None = None
                        ) -> tuple[SplitEvaluation, int, EvalData]:
    """Evaluate a checkpoint on a split of a corpus in this process (any saved layout: the
    checkpoint reshards into one process), with its config's precision and micro-batch
    size. Returns the evaluation, the checkpoint's step and what was scored
    (``evaluate_corpus.EvalData``: its ``note`` says it in one line).

    Args:
        split: valid, test or all (the whole corpus); None: valid for the run's corpus, all
            for another one (``evaluate_corpus.py``).
        corpus: a corpus folder to read instead of the config's ``data.corpus``: a copy of
            it, or any corpus of the run's tokenizer (each dataset scored on its own, the
            blend by size); its index is then kept in ``CORPUS/.index``.
        log: where the checks of token files without a fingerprint say what they read, and
            which checkpoint of a run folder is scored.

    Raises:
        UserError: an unknown split, a corpus that is gone (naming its path) or made by
            another tokenizer, a split the index does not have (``data.split`` gives it no
            share), a bad sample count, or a checkpoint that does not load.
    """

    # a run folder: its newest checkpoint, said in a line (checkpoint/path_kind.py)
    path = checkpoint_to_read(checkpoint, "evaluate", log or (lambda line: None))
    cfg = load_config_of(path, Config)
    count = cfg.train.eval_samples if num_samples is None else num_samples
    if count < 1:
        raise UserError(f"--samples {count}: must be at least 1")
    if corpus is None and uses_data_args(cfg.data):
        return _scored_data_args(cfg, path, split or "valid", count)
    if corpus is None and cfg.data.corpus and not Path(cfg.data.corpus).exists():
        raise UserError(f"{checkpoint}: its data.corpus {cfg.data.corpus} no longer exists; "
                        "pass --data with the corpus folder (a copy of it)")
    data = choose_eval_data(cfg, corpus, split)
    check_eval_tokens(cfg, path, data, cfg.model.vocab_size, log)
    cfg.data.corpus, cfg.data.cache_dir = data.corpus, data.cache_dir
    if not data.runs_corpus or data.split == "all":
        return _scored(cfg, path, open_eval_samples(cfg, data), count, data)
    split = data.split
    # the splits first: a missing one is reported before the weights are read
    splits = open_splits(cfg.data.corpus, cfg.data.seq_length, cfg.train.train_samples,
                         None, cfg.data.split, cfg.data.seed, cfg.data.weights,
                         cfg.data.cache_dir,
                         phases=configured_phases(cfg.data, cfg.train.train_samples))
    if split not in splits:
        raise UserError(f"--split {split}: the index of {cfg.data.corpus} has no {split} split "
                        f"(data.split {cfg.data.split!r} gives it no share); choose "
                        f"{' or '.join(s for s in SPLITS if s in splits) or 'another split'}")
    return _scored(cfg, path, splits[split], count, data)


def _scored(cfg: Config, path: Path, samples, count: int, data: EvalData
            ) -> tuple[SplitEvaluation, int, EvalData]:
    """The checkpoint's losses on ``samples`` (the blend and each dataset), its step, and
    ``data``."""
    runner, state = _checkpoint_runner(cfg, path)
    name = _single_name(cfg.data.corpus) if blend_of(samples) is None else "blend"
    result = evaluate_split(runner.sample_losses, samples, count, data.split, name)
    return result, int(state.get("step", 0)), data


def _scored_data_args(cfg: Config, path: Path, split: str, count: int
                      ) -> tuple[SplitEvaluation, int, EvalData]:
    """A run that named its datasets by Megatron's data arguments (data.data_path, ...):
    its own valid or test split, read as its validation read it."""
    source = data_source(cfg.data)
    if split not in SPLITS:
        raise UserError(f"--split {split}: a run of {describe(source)} is scored on its valid "
                        "or test split (--data CORPUS scores another corpus whole)")
    splits = open_splits(source, cfg.data.seq_length, cfg.train.train_samples, None,
                         cfg.data.split, cfg.data.seed, cfg.data.weights, cfg.data.cache_dir,
                         phases=configured_phases(cfg.data, cfg.train.train_samples))
    if split not in splits:
        raise UserError(f"--split {split}: the run's data ({describe(source)}) has no {split} "
                        f"split; choose {' or '.join(s for s in SPLITS if s in splits)}")
    samples = splits[split]
    names = (source.per_split[split] if source.per_split is not None else source.blend)
    name = names[0].name if blend_of(samples) is None else "blend"
    runner, state = _checkpoint_runner(cfg, path)
    result = evaluate_split(runner.sample_losses, samples, count, split, name)
    data = EvalData(describe(source), split, cfg.data.weights or None, cfg.data.cache_dir, True,
                    f"{describe(source)}: the run's datasets, scored as the run's validation "
                    f"(its {split} split)")
    return result, int(state.get("step", 0)), data


def _checkpoint_runner(cfg: Config, path: Path):
    """The step runner of ``cfg``'s model in this one process on the CPU (built as training
    builds it: ``build.build_run``), with the checkpoint's weights; and its trainer state. The
    run's layout is not this process's: one process, no recomputation or compile (forward
    only), the rest (precision, micro-batch size, attention) as the run had it."""
    from bloomline.trainer.build import build_run
    from bloomline.trainer.config import ParallelConfig
    from bloomline.trainer.run_spec import settle

    one_process = copy.deepcopy(cfg)
    one_process.parallel = ParallelConfig()
    one_process.train.compile = False
    one_process.train.device = "cpu"
    # the checkpoint holds the model: no resume or init_from to settle it from
    one_process.checkpoint.resume, one_process.checkpoint.init_from = "none", ""
    spec = settle(one_process, 1, 0, check_tokenizer=False)
    built = build_run(spec, None, torch.device("cpu"))
    state = load_checkpoint(path, built.model)
    return built.runner, state


def _single_name(corpus: str) -> str:
    """The name of a one-dataset corpus (its NAME.idx), for the table's row."""
    names = sorted(p.stem for p in Path(corpus).glob("*.idx"))
    return names[0] if len(names) == 1 else "all"
