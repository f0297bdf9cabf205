"""A run reports "completed" only when it trained to its end: non-finite weights are neither
trained from nor saved, skip ranges that leave nothing to train (after a rollback, or added
over samples a checkpoint already trained) stop the run with one line, and a stop signal
before the first step ends the run at once (no open() or read can hold it), lock released.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.loop import Trainer
from bloomline.trainer.survival.finite_weights import check_finite_weights
from bloomline.trainer.survival.preemption import StoppedBeforeTrainingError, StopRequests

SETTINGS = {"train": {"train_samples": 40, "log_interval": 1},
            "checkpoint": {"interval": 2, "keep_last": 10}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("outcomes") / "corpus")


def _nan_checkpoint(corpus: str, run_dir) -> object:
    """A consistent checkpoint (manifest and all) of step 2 whose embedding is NaN."""
    trainer = Trainer(tiny_config(corpus, run_dir, **SETTINGS), log=lambda *_: None)
    with torch.no_grad():
        trainer.model.word_embeddings.weight[3, 1] = float("nan")
    trainer.state.step, trainer.state.consumed_samples = 2, 8
    return ckpt.save_checkpoint(run_dir, 2, trainer.model, trainer.optimizer,
                                trainer.state.state_dict(), trainer.cfg, keep_last=1)


def test_nan_weights_are_neither_resumed_nor_initialized_from(corpus, tmp_path):
    """Bug: resuming (or init_from) a checkpoint whose weights hold NaN skipped every step as
    non-finite, saved the NaN weights again, rolled back to them, skipped the rest of the data
    and reported "completed" with exit 0: both must stop at the start with one line naming
    the checkpoint and the tensor."""
    path = _nan_checkpoint(corpus, tmp_path / "run")
    with pytest.raises(UserError, match=r"step_00000002: parameter word_embeddings\.weight "
                                        r"holds NaN or inf; it cannot be trained from"):
        Trainer(tiny_config(corpus, tmp_path / "run", **SETTINGS), log=lambda *_: None).run()
    fresh = tiny_config(corpus, tmp_path / "other", **SETTINGS)
    fresh.checkpoint.init_from = str(path)
    with pytest.raises(UserError, match=r"checkpoint\.init_from .*step_00000002: parameter "
                                        r"word_embeddings\.weight holds NaN"):
        Trainer(fresh, log=lambda *_: None).run()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step_00000002"]


def test_nan_weights_are_not_saved(corpus, tmp_path):
    """Bug: a checkpoint saved from non-finite weights becomes the run's newest, which the
    resume and every rollback then load: the save must refuse, leaving no folder."""
    trainer = Trainer(tiny_config(corpus, tmp_path / "run", **SETTINGS), log=lambda *_: None)
    with torch.no_grad():
        trainer.model.h["0"].mlp.dense_4h_to_h.weight[0, 0] = float("inf")
    with pytest.raises(UserError, match=r"step 0: parameter h\.0\.mlp\.dense_4h_to_h\.weight "
                                        r"holds NaN or inf; not saved"):
        trainer.save()
    assert not (tmp_path / "run" / "checkpoints").exists() or not list(
        (tmp_path / "run" / "checkpoints").iterdir())
    check_finite_weights(torch.nn.Linear(2, 2), "a finite model", "")  # no error


def test_a_rollback_that_skips_the_rest_of_the_run_stops_it(corpus, tmp_path):
    """Bug: a rollback whose skip range reached the end of the data (here from the checkpoint
    on) ended the loop, saved, and printed "run completed" with exit 0 having trained nothing
    after the checkpoint: it must stop with one line and no "completed" state."""
    settings = {**SETTINGS, "train": {"train_samples": 120, "log_interval": 1},
                "checkpoint": {"interval": 5, "keep_last": 10},
                "spike": {"window": 10, "min_history": 5, "skip_before": 10,
                          "skip_after": 100}}
    os.environ["BLOOMLINE_FAULTS"] = "spike@batch:sample=76;spike@batch:sample=78"
    try:
        with pytest.raises(UserError, match=r"step 20: the rollback's skip ranges \[\[60, "
                                            r"120\]\] leave nothing of train\.train_samples = "
                                            r"120 to train after step 15; the run stops here"):
            Trainer(tiny_config(corpus, tmp_path / "run", **settings), log=lambda *_: None).run()
    finally:
        del os.environ["BLOOMLINE_FAULTS"]


def test_skips_over_trained_samples_are_refused_at_resume(corpus, tmp_path):
    """Bug: a skip range added (in rollbacks.json) over samples the checkpoint had already
    trained shrank the run below the checkpoint's step: "run complete: step 8 of 7", exit 0,
    nothing trained. The resume must refuse it naming the ranges."""
    first = tiny_config(corpus, tmp_path / "run", **SETTINGS)
    first.train.exit_interval = 8
    Trainer(first, log=lambda *_: None).run()
    (tmp_path / "run" / "rollbacks.json").write_text(
        json.dumps({"skip_samples": [[0, 12]], "events": []}))
    with pytest.raises(UserError, match=r"resumed at step 8, but the run has 7 steps with the "
                                        r"skip ranges in force \(\[\[0, 12\]\]"):
        Trainer(tiny_config(corpus, tmp_path / "run", **SETTINGS), log=lambda *_: None).run()


def test_a_signal_before_the_first_step_stops_at_once():
    """Bug: a stop signal while the run was still opening its data only set a flag, so a run
    stuck in open() (a FIFO in the index cache) ignored SIGTERM and SIGINT for 17 minutes:
    in a run's setup the handler must raise (interrupting the blocked call), after
    ``begin_training`` it must only ask for a checkpoint."""
    stops = StopRequests()
    stops.begin_setup()
    stops.install()
    try:
        with pytest.raises(StoppedBeforeTrainingError, match="received SIGTERM before the "
                                                             "first step"):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run here
        stops.begin_training()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.local_reason(0.0) == "received SIGTERM"
    finally:
        stops.uninstall()
