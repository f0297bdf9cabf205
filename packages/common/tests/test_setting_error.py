"""``SettingError``: one error about a setting, worded by each front end in its own names."""

from __future__ import annotations

import pickle

import pytest

from bloomline.common.errors import SettingError, UserError

FLAGS = {"split": "--split", "seq_length": "--seq-length", "weights": "--weight",
         "weights.ENTRY": "--weight {entry}=..."}
KEYS = {"split": "data.split", "seq_length": "data.seq_length", "weights": "data.weights",
        "weights.ENTRY": "data.weights.{entry}"}


def test_each_front_end_words_the_same_error_in_its_names():
    """Catches: a front end that still shows another's names (the trainer saying --split), or
    a rewording that loses the rest of the message."""
    err = SettingError("split", "{setting} {value!r}: lower {seq_length} or widen {split}",
                       names=FLAGS, value="9,x")
    assert isinstance(err, UserError) and err.setting == "split"
    assert str(err) == "--split '9,x': lower --seq-length or widen --split"
    assert str(err.named(KEYS)) == "data.split '9,x': lower data.seq_length or widen data.split"


def test_an_entry_of_a_mapping_setting_is_named_by_the_front_ends_format():
    """Catches: dataprep's ``--weight wiki=...`` shown in the trainer for ``data.weights.wiki``."""
    err = SettingError("weights", "{setting}: no dataset {name!r}", entry="wiki", names=FLAGS,
                       name="wiki")
    assert str(err) == "--weight wiki=...: no dataset 'wiki'"
    assert str(err.named(KEYS)) == "data.weights.wiki: no dataset 'wiki'"


def test_values_are_text_and_settings_a_front_end_lacks_keep_their_name():
    """Catches: a user's value with braces taken as a template field (a KeyError instead of
    the error), a setting the front end has no name for lost, a prefix dropped by named."""
    err = SettingError("split", "{setting} {value}: see {seq_length}", names=FLAGS,
                       value="{seq_length}").within("corpus/a.idx")
    assert str(err) == "corpus/a.idx: --split {seq_length}: see --seq-length"
    renamed = err.named({"split": "data.split"})
    assert str(renamed) == "corpus/a.idx: data.split {seq_length}: see --seq-length"


def test_a_template_field_that_is_neither_value_nor_setting_is_a_bug():
    """Catches: a typo in a template printing a wrong message instead of failing the tests."""
    with pytest.raises(KeyError):
        SettingError("split", "{setting}: {typo}", names=FLAGS)
    with pytest.raises(TypeError, match="named like settings"):
        SettingError("split", "{setting}: {seq_length}", names=FLAGS, seq_length=3)


def test_it_survives_pickling_with_its_fields():
    """Catches: an error sent from a worker process failing to unpickle (an exception is
    rebuilt from its args, which this one's __init__ does not take alone)."""
    err = SettingError("weights", "{setting}: {count} samples", entry="a", names=FLAGS,
                       count=2).within("x")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) == "x: --weight a=...: 2 samples"
    assert str(back.named(KEYS)) == "x: data.weights.a: 2 samples"
