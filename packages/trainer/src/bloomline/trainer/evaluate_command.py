"""``trainer evaluate``: a checkpoint's loss and perplexity on a split of its run's data, in
this process, built as training builds a rank (``build.build_run``) and measured with the
same per-sample forward (the step runner's ``sample_losses``) and the same split evaluation
(``evaluation.evaluate_split``) as the loop's validation.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint import load_checkpoint, load_config_of
from bloomline.trainer.config import Config
from bloomline.trainer.data import blend_of, open_splits
from bloomline.trainer.evaluation import SplitEvaluation, evaluate_split

__all__ = ["SPLITS", "evaluate_checkpoint"]

SPLITS = ("valid", "test")


def evaluate_checkpoint(checkpoint: str | Path, split: str = "valid",
                        num_samples: int | None = None,
                        corpus: str | None = None) -> tuple[SplitEvaluation, int]:
    """Evaluate a checkpoint on a split of its run's data in this process (any saved layout:
    the checkpoint reshards into one process), with its config's precision and micro-batch
    size. Returns the evaluation and the checkpoint's step.

    Args:
        corpus: a corpus folder to read instead of the config's ``data.corpus`` (a copy of
            it); its index is then kept in ``CORPUS/.index``, not the config's cache folder.

    Raises:
        UserError: an unknown split, a corpus that is gone (naming its path), a split the
            index does not have (``data.split`` gives it no share), a bad sample count, or a
            checkpoint that does not load.
    """

    if split not in SPLITS:
        raise UserError(f"--split {split}: expected one of {', '.join(SPLITS)}")
    path = Path(checkpoint)
    cfg = load_config_of(path, Config)
    count = cfg.train.eval_samples if num_samples is None else num_samples
    if count < 1:
        raise UserError(f"--samples {count}: must be at least 1")
    if corpus is not None:
        cfg.data.corpus, cfg.data.cache_dir = corpus, ""
    elif cfg.data.corpus and not Path(cfg.data.corpus).exists():
        raise UserError(f"{checkpoint}: its data.corpus {cfg.data.corpus} no longer exists; "
                        "pass --data with the corpus folder (a copy of it)")
    # the splits first: a missing one is reported before the weights are read
    splits = open_splits(cfg.data.corpus, cfg.data.seq_length, cfg.train.train_samples,
                         None, cfg.data.split, cfg.data.seed, cfg.data.weights,
                         cfg.data.cache_dir)
    if split not in splits:
        raise UserError(f"--split {split}: the index of {cfg.data.corpus} has no {split} split "
                        f"(data.split {cfg.data.split!r} gives it no share); choose "
                        f"{' or '.join(s for s in SPLITS if s in splits) or 'another split'}")
    runner, state = _checkpoint_runner(cfg, path)
    samples = splits[split]
    name = _single_name(cfg.data.corpus) if blend_of(samples) is None else "blend"
    result = evaluate_split(runner.sample_losses, samples, count, split, name)
    return result, int(state.get("step", 0))


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
