"""``trainer evaluate CKPT --data OTHER``: any corpus of the run's tokenizer is scored per
dataset, the blend by size, the whole corpus by default; the run's own corpus (or a copy) as
the run's validation. One weighted 2-dataset run for the module (4 steps, tiny model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_per_dataset_eval import SECTIONS, _cli, _records, _write_dataset
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.evaluate_command import evaluate_checkpoint
from bloomline.trainer.loop import Trainer

WEIGHTS = {"code": 0.3, "en": 0.7}


@pytest.fixture(scope="module")
def weighted_run(tmp_path_factory) -> dict:
    """A run on code + en with data.weights, its checkpoint at step 4, and a held-out corpus
    of other names: ``web`` (a copy of en's file) and ``wiki`` (new ramps)."""
    root = tmp_path_factory.mktemp("weighted")
    corpus = root / "corpus"
    corpus.mkdir()
    _write_dataset(corpus, "en", ramp=True, seed=0, documents=90)
    _write_dataset(corpus, "code", ramp=False, seed=1, documents=50)
    sections = {**SECTIONS, "data": {**SECTIONS["data"], "weights": dict(WEIGHTS)}}
    cfg = tiny_config(str(corpus), root / "run", **sections)
    Trainer(cfg, log=lambda *_: None).run()
    heldout = root / "heldout"
    heldout.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(corpus / f"en{suffix}", heldout / f"web{suffix}")
    _write_dataset(heldout, "wiki", ramp=True, seed=7, documents=40)
    return {"corpus": corpus, "heldout": heldout,
            "checkpoint": root / "run" / "checkpoints" / "step_00000004",
            "valid": _records(root / "run", "valid")[-1]}


@pytest.mark.slow
def test_another_corpus_is_scored_per_dataset_whatever_the_runs_weights(weighted_run):
    """Bug: `trainer evaluate CKPT --data heldout` on a corpus that is not a copy of the
    training corpus fails with `data.weights.code: no dataset 'code' in the corpus`; or
    scores it with weights of datasets it does not have; or scores only its small valid
    share without saying so."""
    lines: list[str] = []
    result, step, scored = evaluate_checkpoint(weighted_run["checkpoint"],
                                               corpus=str(weighted_run["heldout"]),
                                               log=lines.append)
    assert step == 4 and not scored.runs_corpus and scored.split == "all"
    assert scored.weights is None
    assert "not the run's corpus (its datasets: web, wiki; the run's: code, en)" in scored.note
    assert "the blend by size" in scored.note and "the whole corpus (--split all" in scored.note
    assert [row.name for row in result.datasets] == ["web", "wiki"]
    assert all(row.samples == 5 and np.isfinite(row.loss) for row in result.datasets)
    # the files carry no fingerprint: their ids were checked, and the line says so
    assert [line.split(":")[0] for line in lines] == [
        f"{weighted_run['heldout']}/web", f"{weighted_run['heldout']}/wiki"]
    assert all("all < vocabulary 128" in line for line in lines)
    # web is en's file: its valid share, scored on its own, is the run's valid_loss/en
    result, _, scored = evaluate_checkpoint(weighted_run["checkpoint"], "valid",
                                            corpus=str(weighted_run["heldout"]))
    web = next(row for row in result.datasets if row.name == "web")
    assert web.loss == pytest.approx(weighted_run["valid"]["valid_loss/en"], rel=1e-5)


@pytest.mark.slow
def test_the_runs_corpus_is_scored_as_the_runs_validation(weighted_run, tmp_path):
    """Bug: a copy of the training corpus (same files, elsewhere) taken for a held-out one:
    scored whole (training data included) instead of its valid split."""
    copy = tmp_path / "copy"
    shutil.copytree(weighted_run["corpus"], copy, ignore=shutil.ignore_patterns(".index"))
    result, _, scored = evaluate_checkpoint(weighted_run["checkpoint"], corpus=str(copy))
    assert scored.runs_corpus and scored.split == "valid" and scored.weights == WEIGHTS
    assert "the run's datasets (code, en)" in scored.note
    assert result.overall.loss == pytest.approx(weighted_run["valid"]["valid_loss"], rel=1e-5)


@pytest.mark.slow
def test_a_corpus_of_ids_beyond_the_vocabulary_is_refused(weighted_run, tmp_path):
    """Bug: a corpus of another tokenizer (no fingerprint to say so) scored as if its ids
    meant the run's tokens, or failing deep inside the embedding."""
    other = tmp_path / "other"
    other.mkdir()
    with IndexedDatasetWriter(other / "big", np.uint16) as writer:
        writer.add_document(np.array([5, 300, 7, 95], np.uint16))
    with pytest.raises(UserError) as refused:
        evaluate_checkpoint(weighted_run["checkpoint"], corpus=str(other))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{other}/big: no tokenizer fingerprint (written by another "
                              "tool), and token id 300 is not below the vocabulary 128")


@pytest.mark.slow
def test_cli_scores_a_heldout_corpus_and_says_what(weighted_run):
    """Bug: the CLI fails on a held-out corpus, or does not say which split and blend it
    scored."""
    done = _cli(weighted_run["checkpoint"], "--data", weighted_run["heldout"])
    lines = done.stdout.splitlines()
    assert lines[0].endswith("(step 4), the whole corpus:")
    assert [line.split()[0] for line in lines[2:]] == ["web", "wiki", "blend"]
    assert "not the run's corpus" in done.stderr and "(--split all;" in done.stderr
    out = json.loads(_cli(weighted_run["checkpoint"], "--data", weighted_run["heldout"],
                          "--split", "valid", "--json").stdout)
    assert out["split"] == "valid" and out["runs_corpus"] is False
    assert Path(out["corpus"]) == weighted_run["heldout"]
