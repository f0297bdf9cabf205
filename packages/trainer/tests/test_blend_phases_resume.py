"""Blend phases in a run (``blend_phases.py``): ``data.phases`` and a resume with other
``data.weights`` become phases of the one train index, the samples already trained stay the
same, each dataset goes on with its own order, and a later resume keeps the list.

One module run of three sessions in this process (48 samples, 4 per step): 3 steps with
weights a=0.5 b=0.5, 3 steps resumed with a=0.2 b=0.8 (a new phase at sample 12), then the
rest resumed with the same a=0.2 b=0.8 (no change). Each micro-batch's sample ids and tokens
are recorded where the loop takes them (``StepBatches.next_step``). Dataset a is small: the
first weights draw 2 epochs of it, the new ones would draw 1 (another order of it), so the
run keeps its index (``dataprep.kept_indices``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.blend_phases import reordered_datasets
from bloomline.trainer.config_rules import validate
from bloomline.trainer.data import loader, open_splits
from bloomline.trainer.loop import Trainer
from bloomline.trainer.train_state import TrainState

FIRST, NEXT = {"a": 0.5, "b": 0.5}, {"a": 0.2, "b": 0.8}
SAMPLES, RESUMED_AT = 48, 12


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """Two datasets of ramps: a of 12 documents (24 train samples an epoch: the first
    weights' 25 samples of it take 2 epochs, the resumed phases' 15 alone one), b of 80 (one
    epoch)."""
    folder = tmp_path_factory.mktemp("phases") / "corpus"
    folder.mkdir()
    for seed, (name, count) in enumerate((("a", 12), ("b", 80))):
        rng = np.random.default_rng(seed)
        writer = IndexedDatasetWriter(folder / name, np.uint16)
        for _ in range(count):
            length = int(rng.integers(20, 120))
            tokens = (int(rng.integers(0, 95)) + np.arange(length)) % 95
            writer.add_document(np.append(tokens, 95).astype(np.uint16))
        writer.finalize()
    return str(folder)


def _config(corpus: str, run_dir: Path, weights: dict, steps: int, **data):
    return tiny_config(corpus, run_dir, data={"weights": weights, **data},
                       train={"train_samples": SAMPLES, "exit_interval": steps,
                              "eval_interval": 3, "eval_samples": 4, "log_interval": 100},
                       checkpoint={"resume": "auto"})


@pytest.fixture(scope="module")
def sessions(corpus, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("run") / "run"
    taken: list = []
    original = loader.StepBatches.next_step

    def recording(self, count, length):
        micro, ids = original(self, count, length)
        taken.append((sum(ids, []), np.concatenate([m.numpy() for m in micro])))
        return micro, ids

    logs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader.StepBatches, "next_step", recording)
        for weights, steps in ((FIRST, 3), (NEXT, 3), (NEXT, 6)):
            lines: list[str] = []
            start = len(taken)
            Trainer(_config(corpus, run_dir, weights, steps), log=lines.append).run()
            ids = [i for step_ids, _ in taken[start:] for i in step_ids]
            tokens = np.concatenate([t for _, t in taken[start:]])
            logs.append({"lines": lines, "ids": ids, "tokens": tokens})
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    states = {path.name: json.loads((path / "trainer_state.json").read_text())
              for path in checkpoints}
    return {"logs": logs, "states": states, "run_dir": run_dir}


@pytest.mark.slow  # the module's three training sessions
def test_new_weights_on_resume_are_a_phase_and_the_past_stays(corpus, sessions):
    """Bug: a resume with other weights rebuilding the whole blend with them (the samples
    already trained would change and each dataset would jump to another point of its order,
    as a Megatron relaunch does), a new phase placed elsewhere than at the resumed sample, or
    the change said nowhere."""
    first, second, third = sessions["logs"]
    assert first["ids"] + second["ids"] + third["ids"] == list(range(SAMPLES))
    resumed = [line for line in second["lines"] if line.startswith("data: resumed")]
    assert resumed == ["data: resumed at sample 12 with other blend weights than the "
                       "checkpoint's; blend phases now 0: a=0.5 b=0.5; 12: a=0.2 b=0.8 (the "
                       "samples before 12 unchanged)"], second["lines"]
    assert "step 4: blend phase 1 begins at sample 12: a=0.2 b=0.8" in second["lines"]
    assert not any(line.startswith("warning: data") for line in second["lines"])  # kept
    # the uninterrupted start (one phase) and the run's final index agree on the past
    plain, phased = _indices(corpus, sessions)
    past = list(range(RESUMED_AT))
    np.testing.assert_array_equal(first["tokens"], plain.samples.get_batch(past))
    np.testing.assert_array_equal(first["tokens"], phased.samples.get_batch(past))
    rest = list(range(RESUMED_AT, SAMPLES))
    np.testing.assert_array_equal(np.concatenate([second["tokens"], third["tokens"]]),
                                  phased.samples.get_batch(rest))
    # after it the new weights, each dataset on in its own order (no repeat, no gap)
    which = np.asarray(phased.samples.dataset_index)
    own = np.asarray(phased.samples.dataset_sample_index)
    counts = np.bincount(which[RESUMED_AT:SAMPLES], minlength=2)
    assert abs(counts[1] - 0.8 * (SAMPLES - RESUMED_AT)) < 2, counts
    for number in range(2):
        served = own[which == number]
        np.testing.assert_array_equal(served, np.arange(len(served)))


def _indices(corpus, sessions) -> tuple:
    """The train samples of the first session's index (one phase) and of the run's final
    one (its phases, its recorded index sizes kept)."""
    cfg = _config(corpus, sessions["run_dir"], FIRST, 0)
    args = (corpus, cfg.data.seq_length, SAMPLES, None, cfg.data.split, cfg.data.seed, FIRST)
    final = sessions["states"]["step_00000012"]
    return (open_splits(*args)["train"],
            open_splits(*args, phases=final["data_phases"],
                        kept_sizes=final["data_index_samples"])["train"])


@pytest.mark.slow  # the module's three training sessions
def test_a_dataset_the_new_weights_draw_less_of_goes_on_in_its_order(corpus, sessions):
    """Bug: a resume that lowers a dataset's weight sizing its index anew for the smaller
    draw: another number of epochs, so Megatron's order of it is reshuffled and the samples
    after the resume repeat some it trained and skip others; or the index sizes not recorded
    (a later resume could not keep them)."""
    states = sessions["states"]
    for name in ("step_00000003", "step_00000006", "step_00000012"):
        assert states[name]["data_index_samples"] == {"a": 25, "b": 25}, name
    plain, phased = _indices(corpus, sessions)
    first = plain.samples.datasets[0]
    # not vacuous: the new phases alone size a's index for 1 epoch, the run's has 2
    cfg = _config(corpus, sessions["run_dir"], FIRST, 0)
    alone = open_splits(corpus, cfg.data.seq_length, SAMPLES, None, cfg.data.split,
                        cfg.data.seed, FIRST,
                        phases=states["step_00000012"]["data_phases"])["train"]
    assert alone.index_samples == {"a": 15, "b": 36}
    shapes = [(ds.index.num_epochs, ds.index.separate_last_epoch)
              for ds in (first, alone.samples.datasets[0])]
    assert shapes == [(2, True), (1, False)], shapes
    # what the run trained of each dataset, in order: that dataset's own order from its
    # first sample, across the resume (no repeat, no gap)
    trained = np.concatenate([log["tokens"] for log in sessions["logs"]])
    which = np.asarray(phased.samples.dataset_index)[:SAMPLES]
    for number, dataset in enumerate(plain.samples.datasets):
        own = trained[which == number]
        expected = np.stack([dataset[i] for i in range(len(own))])
        np.testing.assert_array_equal(own, expected)
    assert any(line.startswith("data: resumed") for line in sessions["logs"][1]["lines"])


@pytest.mark.slow  # the module's three training sessions
def test_the_phase_list_is_recorded_and_kept_by_a_later_resume(sessions):
    """Bug: the checkpoint not recording the phases the run trained with (a later resume
    would rebuild from the config alone: its first phase with the new weights, the past
    changed), or a resume without a change appending another phase."""
    states = sessions["states"]
    assert states["step_00000003"]["data_phases"] == [[0, FIRST]]
    for name in ("step_00000006", "step_00000012"):
        assert states[name]["data_phases"] == [[0, FIRST], [RESUMED_AT, NEXT]], name
    third = sessions["logs"][2]["lines"]
    assert not any("blend phase" in line or line.startswith("data: resumed")
                   for line in third), third


@pytest.mark.slow  # the module's three training sessions
def test_per_dataset_validation_after_a_phase(sessions):
    """Bug: the phased index losing a dataset's own validation loss (the valid split keeps
    the first phase's blend and every dataset as a component)."""
    lines = (sessions["run_dir"] / "metrics.jsonl").read_text().splitlines()
    valid = [r for r in map(json.loads, lines) if r["kind"] == "valid"]
    assert valid and all({"valid_loss/a", "valid_loss/b"} <= set(r) for r in valid), valid


@pytest.mark.parametrize(("data", "expected"), [
    ({"weights": FIRST, "phases": {"x": NEXT}}, "data.phases.x: a phase is keyed by the "
                                                "train sample it starts at"),
    ({"weights": FIRST, "phases": {"48": NEXT}}, "data.phases.48: the start must be above 0 "
                                                 "and below train.train_samples (48)"),
    ({"phases": {"12": NEXT}}, "data.phases: phases change the blend weights; give the "
                               "first phase's as data.weights too"),
    ({"weights": FIRST, "phases": {"12": {"a": 0, "b": 0}}},
     "data.phases.12: the weights must not all be zero"),
])
def test_bad_phases_in_the_config(tmp_path, data, expected):
    """Bug: a phase key that is no sample count, past the run, without first weights or with
    all-zero weights accepted (never drawn, or a blend drawing nothing) or refused with a
    traceback instead of one line naming the key."""
    cfg = tiny_config("corpus", tmp_path, data=data, train={"train_samples": SAMPLES})
    with pytest.raises(UserError) as refused:
        validate(cfg)
    assert str(refused.value) == expected or str(refused.value).startswith(expected), \
        str(refused.value)


def test_unknown_dataset_in_a_phase_names_the_key(corpus):
    """Bug: a phase naming a dataset the corpus lacks worded with dataprep's flag (--phase)
    instead of the trainer's key, or accepted."""
    with pytest.raises(UserError) as refused:
        open_splits(corpus, 32, SAMPLES, None, "90,10,0", 1234, FIRST,
                    phases=[[0, FIRST], [12, {"a": 0.5, "web": 0.5}]])
    assert str(refused.value).startswith("data.phases.12: no dataset 'web' in the corpus"), \
        str(refused.value)


def test_a_phase_that_needs_more_than_an_index_holds_is_named(corpus):
    """Bug: new phases that need more of a dataset than its index holds (its index built
    anew for another number of epochs: its order reshuffled by megatron-core's rule, so
    samples repeat or are skipped after the resume) going unsaid, or a dataset whose index
    was kept named."""
    args = (corpus, 32, 400, None, "90,10,0", 1234, FIRST)
    before = open_splits(*args, phases=[[0, FIRST]])["train"]
    after = open_splits(*args, phases=[[0, FIRST], [12, {"a": 1.0, "b": 0.0}]],
                        kept_sizes=before.index_samples)["train"]
    assert after.index_samples["b"] == before.index_samples["b"]
    lines = reordered_datasets(before.samples, after.samples, 12)
    assert [line.split("; built")[0] for line in lines] == [
        "warning: data: the new blend phases draw more of 'a' than its index holds (218 "
        "samples, 9 epoch(s))"], lines


@pytest.mark.parametrize("sizes", [{"a": 0}, {"a": "25"}, [25], {"a": True}])
def test_bad_index_sizes_in_a_checkpoint(sizes):
    """Bug: a trainer state whose index sizes are no sample counts accepted (a resume would
    keep an index of 0 samples or fail deep in the build), or a checkpoint that predates
    them not loading (they default to none: the phases alone size the indices)."""
    state = TrainState()
    state.load_state_dict({"step": 3, "data_phases": [[0, FIRST]]})
    assert state.data_index_samples == {}
    with pytest.raises(UserError, match="data_index_samples: must be an object of sample "
                                        "counts >= 1 by dataset name"):
        state.load_state_dict({"step": 3, "data_index_samples": sizes})
