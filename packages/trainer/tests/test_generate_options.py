"""``trainer generate``'s sampling options: out of range, each is refused in one line naming
the option and its range, before the checkpoint is read."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.trainer.cli import app


@pytest.mark.parametrize("option,value,expected", [
    ("--temperature", "nan", r"--temperature nan: must be a finite number >= 0"),
    ("--temperature", "inf", r"--temperature inf: must be a finite number >= 0"),
    ("--temperature", "-1", r"--temperature -1.0: must be a finite number >= 0"),
    ("--top-p", "2", r"--top-p 2.0: must be in \(0, 1\]"),
    ("--top-p", "0", r"--top-p 0.0: must be in \(0, 1\]"),
    ("--top-p", "nan", r"--top-p nan: must be in \(0, 1\]"),
    ("--top-k", "-5", r"--top-k -5: must be >= 0"),
    ("--max-new-tokens", "-1", r"--max-new-tokens -1: must be >= 1"),
    ("--max-new-tokens", "0", r"--max-new-tokens 0: must be >= 1"),
])
def test_out_of_range_sampling_options_are_one_line(tmp_path, option, value, expected):
    """Bug: --temperature nan (NaN probabilities, multinomial fails), --temperature -1 (quietly
    greedy), --top-p 2 or 0 (quietly all tokens), --top-k -5 and --max-new-tokens -1 (quietly
    nothing generated) were all accepted."""
    missing = tmp_path / "no-checkpoint"  # the options are checked before it is opened
    result = CliRunner().invoke(app, ["generate", str(missing), "--prompt", "x", option, value])
    assert isinstance(result.exception, UserError), result.output
    message = str(result.exception)
    assert "\n" not in message
    assert re.match(expected, message), message


def test_in_range_sampling_options_pass_the_check():
    """Bug: the check refusing the documented values (0: greedy / all tokens, top-p 1)."""
    from bloomline.trainer.generate import check_sampling_options

    for args in ((1, 0.0, 0, 1.0), (48, 0.8, 40, 0.9), (5, 2.5, 1, 1e-6)):
        check_sampling_options(*args)
