"""The run is settled once (``run_spec.settle``) into a frozen spec, and its state is typed
(``train_state.TrainState``)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from equivalence import equivalence_config

from bloomline.common.config_loader import thawed_copy
from bloomline.trainer import config_rules
from bloomline.trainer.run_spec import settle
from bloomline.trainer.train_state import TrainState


def test_settling_leaves_the_config_alone_and_freezes_the_spec():
    """Bug: settling mutating the caller's config (the loaded config changed behind its back:
    a resolved dtype, a vocabulary), or a settled spec that code can still change after the
    checks ran (a rule checked on one value, the run built from another)."""
    cfg = equivalence_config(precision={"dtype": "auto"})
    spec = settle(cfg, 1, 0, device="cpu")
    assert cfg.precision.dtype == "auto" and spec.config.precision.dtype in ("bf16", "fp32")
    with pytest.raises(dataclasses.FrozenInstanceError, match="optimizer.lr|lr"):
        spec.config.optimizer.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.config.model = cfg.model
    # copies that may change, pickles and replacements are plain again or stay equal
    copy = thawed_copy(spec.config)
    copy.optimizer.lr = 1.0
    assert spec.config.optimizer.lr != 1.0
    assert pickle.loads(pickle.dumps(spec.config)) == spec.config
    assert dataclasses.replace(spec.config.train, seed=7).seed == 7


def test_every_rule_is_checked_once_per_settle(monkeypatch):
    """Bug: the config validated again and again on the way to a run (four times per start),
    so that a rule's cost or a side effect repeats and the places that check drift apart."""
    calls = []
    original = config_rules.validate
    monkeypatch.setattr(config_rules, "validate",
                        lambda *args, **kwargs: calls.append(args) or original(*args, **kwargs))
    settle(equivalence_config(parallel={"tensor_parallel": 2}), 4, 1, device="cpu")
    assert len(calls) == 1


def test_train_state_round_trips_and_counts():
    """Bug: a counter lost or renamed between the trainer and ``trainer_state.json`` (a resumed
    run restarting its bad-step streak or its rollback count), or an older checkpoint without
    a newer key failing to load."""
    state = TrainState()
    state.advance(8, 16, 8)
    assert state.count_skipped(bad=True) == 1 and state.count_skipped(bad=False) == 1
    state.count_good()
    state.skip_samples.append([3, 5])
    saved = state.state_dict()
    assert "stopped" not in saved
    again = TrainState()
    again.load_state_dict(saved)
    assert again == state and again.skip_samples is not state.skip_samples
    old = TrainState()
    old.load_state_dict({"step": 4, "consumed_samples": 32})  # a checkpoint before rollbacks
    assert (old.step, old.consumed_samples, old.rollbacks, old.skip_samples) == (4, 32, 0, [])
    assert (state.step, state.consumed_samples, state.consumed_tokens) == (1, 8, 128)
    assert (state.skipped_steps, state.bad_in_row) == (2, 0)
