"""The progress line: rates, percentage and ETA must be computed from the right counters."""

from __future__ import annotations

import io

from bloomline.common import Counter, Progress, format_duration
from bloomline.common.progress import BYTES, format_quantity


class TenSecondsIn(Progress):
    """A progress 10 s in, whatever the clock says: rates and ETAs become exact."""

    elapsed = 10.0


def test_render_shows_rates_percent_and_eta():
    """Catches: ETA computed from the wrong counter, or a rate without its unit
    (``5 MB (0.5/s)``: 0.5 what per second?)."""
    out = io.StringIO()
    progress = TenSecondsIn("job", [Counter("bytes", BYTES), Counter("docs", "docs")],
                            total=200.0, total_key="source", stream=out)
    progress.update(bytes=5e6, docs=1200, source=50.0)
    line = progress.render()
    assert line.startswith("job  25%")
    assert "5 MB (500 kB/s)" in line and "1.2k docs (120 docs/s)" in line
    assert "ETA 0:30" in line  # 10 s for 25% -> 30 s for the remaining 75%


def test_byte_counts_take_the_prefix_their_size_calls_for():
    """Catches: a small input shown as ``6.3e-05 MB``, or 999.7 rounded to ``1e+03``."""
    assert [format_quantity(v, BYTES) for v in (63, 12_345, 3.45e6, 2.5e9, 0)] == [
        "63 B", "12.3 kB", "3.45 MB", "2.5 GB", "0 B"]
    assert format_quantity(999.7, "docs") == "1k docs"
    assert format_quantity(0.004, "docs") == "<0.01 docs"


def test_the_last_line_says_done_even_when_the_total_was_an_estimate():
    """Catches: a finished job whose last line reads ``80% ... ETA 0:00`` because the total
    it was measured against (on-disk bytes) was larger than the work counted."""
    out = io.StringIO()
    progress = TenSecondsIn("job", [Counter("n", "items")], total=100.0, total_key="source",
                            stream=out, log_interval=1e9)
    progress.update(n=5, source=75.0)
    assert " 75% " in progress.render() and "ETA 0:03" in progress.render()
    progress.update(source=30.0)  # past the estimate before the end: not yet 100%
    assert progress.render().startswith("job  99%") and "ETA" not in progress.render()
    progress.close()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("job 100%") and last.endswith("| done") and "ETA" not in last


def test_a_job_that_stops_early_keeps_its_fraction():
    """Catches: ``close(done=False)`` (a job that stopped) claiming 100%."""
    out = io.StringIO()
    progress = TenSecondsIn("job", [Counter("n", "items")], total=100.0, total_key="source",
                            stream=out, log_interval=1e9)
    progress.update(source=40.0)
    progress.close(done=False)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("job  40%") and "ETA" not in last and "done" not in last


def test_non_tty_prints_lines_not_carriage_returns():
    """Catches: \\r-redraws polluting log files when stderr is not a terminal."""
    out = io.StringIO()
    progress = Progress("job", [Counter("n", "items")], stream=out, log_interval=0.0)
    progress.update(n=1)
    progress.close()
    text = out.getvalue()
    assert "\r" not in text and text.count("\n") == 2


def test_format_duration():
    """Catches: hours rendered as 60+ minutes."""
    assert format_duration(65) == "1:05"
    assert format_duration(3725) == "1:02:05"


def test_numbers_keep_three_significant_digits():
    """Catches: rates printed as `812.10/s` or counts as `1234567` (unreadable at a glance)."""
    from bloomline.common.progress import _human

    assert [_human(v) for v in (812.1, 5.0, 0.5, 1234567, 4.2e9, 999_999)] == [
        "812", "5", "0.5", "1.23M", "4.2G", "1M"]
