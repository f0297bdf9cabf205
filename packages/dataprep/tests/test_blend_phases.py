"""Blend phases (``blend_phases.py``, ``IndexRequest.phases``, ``build-index --phase``): one
phase is today's blend byte for byte; several keep each phase's shares and every dataset's own
order across the boundaries; bad phases are one line naming ``--phase``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDatasetWriter, IndexRequest, build_sample_datasets
from bloomline.dataprep.blend_phases import BlendPhase, PhasePlan, parse_phase, phase_plan
from bloomline.dataprep.blending import (
    blend_component_sizes,
    build_blend_indices,
    normalize_weights,
)
from bloomline.dataprep.build_index import format_report

WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
PHASES = (BlendPhase(200, {"a": 0.1, "b": 0.1, "c": 0.8}),
          BlendPhase(400, {"a": 0.0, "b": 1.0, "c": 0.0}))
N = 600


def _request(phases=(), weights=WEIGHTS, **extra) -> IndexRequest:
    return IndexRequest(seq_length=16, train_samples=N, split="90,10,0", weights=weights,
                        phases=phases, **extra)


def _arrays(split_ds) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(split_ds.dataset_index), np.asarray(split_ds.dataset_sample_index)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Datasets a, b, c of 300, 120 and 60 documents (c runs into a second epoch)."""
    folder = tmp_path_factory.mktemp("phases") / "corpus"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for name, count in zip("abc", (300, 120, 60), strict=True):
        with IndexedDatasetWriter(folder / name, np.uint16) as writer:
            for length in rng.integers(1, 90, size=count):
                writer.add_document(rng.integers(4, 1000, size=int(length)))
    return folder


def test_one_phase_is_todays_blend(corpus, tmp_path):
    """Bug: a request without phases whose blend or component sizes changed (it must stay
    megatron-core's, which test_megatron_blend_compat checks on the same code path), or a
    cache key that moved (every existing cache rebuilt); and the phase kernel diverging from
    the greedy rule when run as one phase."""
    built = build_sample_datasets(corpus, _request(), cache_dir=tmp_path)
    weights = normalize_weights(list(WEIGHTS.values()))
    expected = build_blend_indices(weights, sum(blend_component_sizes(weights.tolist(), N)))
    for got, want in zip(_arrays(built.splits["train"]), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    rows = built.report["splits"]["train"]["datasets"]
    assert [rows[name]["requested"] for name in WEIGHTS] == blend_component_sizes(
        weights.tolist(), N, 0.005)
    assert "phases" not in built.report["splits"]["train"]["blend"]
    assert phase_plan(WEIGHTS, (), list(WEIGHTS)) is None  # the plain path
    # the phase kernel, run as one phase that draws every dataset, is the same rule
    forced = PhasePlan((0,), (weights,))
    assert forced.size(N) == len(expected[0])
    assert forced.component_sizes(N, 0.005) == blend_component_sizes(weights.tolist(), N, 0.005)
    for got, want in zip(forced.build(forced.size(N)), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_two_phases_keep_shares_and_each_datasets_order(corpus, tmp_path):
    """Bug: a phase drawn with the wrong weights or counted from sample 0 instead of its
    start; a dataset's samples restarting (repeats) or jumping (gaps) at a boundary; the
    positions before a phase start depending on the phases after it (a resume that appends
    a phase would change samples already trained); a dataset's index sized for one phase's
    draw instead of all of them."""
    built = build_sample_datasets(corpus, _request(PHASES), cache_dir=tmp_path)
    train = built.splits["train"]
    which, own = _arrays(train)
    names = list(WEIGHTS)
    starts = [0, *(phase.start for phase in PHASES)]
    ends = [*starts[1:], len(which)]
    for weights, start, end in zip([WEIGHTS, *(p.weights for p in PHASES)], starts, ends,
                                   strict=True):
        counts = np.bincount(which[start:end], minlength=3)
        ideal = np.asarray([weights[n] for n in names]) * (end - start)
        assert np.abs(counts - ideal).max() < 2, (start, counts, ideal)  # the greedy bound
    for number in range(len(names)):
        served = own[which == number]
        np.testing.assert_array_equal(served, np.arange(len(served)))  # no repeat, no gap
        for i in np.flatnonzero(which == number)[[0, -1]]:  # what a blend position reads
            np.testing.assert_array_equal(train[int(i)], train.datasets[number][int(own[i])])
    assert not (which[400:] != 1).any()  # weight 0: not drawn in that phase
    # the first phase's positions are the one-phase blend's
    plain = build_sample_datasets(corpus, _request(), cache_dir=tmp_path).splits["train"]
    np.testing.assert_array_equal(which[:200], _arrays(plain)[0][:200])
    np.testing.assert_array_equal(own[:200], _arrays(plain)[1][:200])
    report = built.report["splits"]["train"]
    for name in names:  # each index built for the phases' total, with the surplus
        total = sum(math.ceil(200 * w[name]) for w in (WEIGHTS, *(p.weights for p in PHASES)))
        assert report["datasets"][name]["requested"] == math.ceil(total * 1.005)
    assert [p["start"] for p in report["blend"]["phases"]] == starts
    assert report["blend"]["phases"][1]["counts"] == {"a": 20, "b": 20, "c": 160}
    text = format_report(built.report)
    assert "phase 1 [200, 400): a 0.1000 -> 0.1000, b 0.1000 -> 0.1000, c 0.8000 -> 0.8000" \
        in text, text
    # the cache key holds the phases: another start is another blend
    moved = (BlendPhase(300, PHASES[0].weights), PHASES[1])
    other = build_sample_datasets(corpus, _request(moved), cache_dir=tmp_path)
    assert other.report["splits"]["train"]["blend"]["cache"] != report["blend"]["cache"]
    # valid keeps the first phase's weights
    valid = built.report["splits"]["valid"]["blend"]["cache"]
    assert valid == build_sample_datasets(corpus, _request(), cache_dir=tmp_path).report[
        "splits"]["valid"]["blend"]["cache"]


def test_a_dataset_only_a_later_phase_draws(corpus, tmp_path):
    """Bug: a dataset of weight 0 in the first phase left out of the blend although a later
    phase draws it, or drawn before its phase (the greedy rule picks a weight-0 dataset on a
    tie at error 0)."""
    weights = {"a": 0.5, "b": 0.5, "c": 0.0}
    phases = (BlendPhase(300, {"a": 0.2, "b": 0.2, "c": 0.6}),)
    built = build_sample_datasets(corpus, _request(phases, weights, valid_samples=50),
                                  cache_dir=tmp_path)
    which, own = _arrays(built.splits["train"])
    assert not (which[:300] == 2).any() and (which[300:] == 2).sum() == 180
    np.testing.assert_array_equal(own[which == 2], np.arange(180))
    # valid: the first phase's weights; c still a component (its own valid loss)
    valid = built.splits["valid"]
    assert valid.names == ["a", "b", "c"] and not (np.asarray(valid.dataset_index) == 2).any()


@pytest.mark.parametrize(("phases", "expected"), [
    ((BlendPhase(400, WEIGHTS), BlendPhase(300, WEIGHTS)),
     "--phase 300:...: phase start 300 must be above the previous phase's (400)"),
    ((BlendPhase(N, WEIGHTS),), f"--phase {N}:...: phase start {N} is not below "
                                f"--train-samples ({N})"),
    ((BlendPhase(10, {"a": 1, "b": 1, "web": 1}),),
     "--phase 10:...: no dataset 'web' in the corpus (it has: a, b, c)"),
    ((BlendPhase(10, {"a": 1, "b": 1}),), "--phase 10:...: a phase weighs every dataset"),
    ((BlendPhase(10, {"a": 0, "b": 0, "c": 0}),), "--phase 10:...: the weights must not "
                                                  "all be zero"),
])
def test_bad_phases_are_one_line_naming_the_flag(corpus, tmp_path, phases, expected):
    """Bug: a phase out of order, past the run or naming a missing dataset accepted (a phase
    never drawn, a blend drawing nothing) or refused with a traceback; anything built first."""
    with pytest.raises(UserError) as refused:
        build_sample_datasets(corpus, _request(phases), cache_dir=tmp_path / "cache")
    message = str(refused.value)
    assert expected in message and "\n" not in message, message
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("5000:code=0.1,docs=0.9", None),
    ("5_000:code=1", None),
    ("5000", "--phase '5000': expected START:NAME=W"),
    ("x:code=1", "--phase 'x:code=1': the start 'x' is not a sample count"),
    ("5:code", "--phase '5:code': 'code': expected NAME=WEIGHT"),
    ("5:code=x", "--phase '5:code=x': 'x' is not a number"),
    ("5:code=1,code=2", "'code' is weighted twice"),
])
def test_phase_flag_syntax(text, expected):
    """Bug: a --phase value misread (a start taken as a name) or refused with a traceback."""
    if expected is None:
        phase = parse_phase(text)
        assert phase.start == 5000 and phase.weights["code"] in (0.1, 1.0)
        return
    with pytest.raises(UserError) as refused:
        parse_phase(text)
    assert expected in str(refused.value), str(refused.value)
