"""The progress line: rates, percentage and ETA must be computed from the right counters."""

from __future__ import annotations

import io

from bloomline.common import Counter, Progress, format_duration


def test_render_shows_rates_percent_and_eta():
    """Catches: ETA computed from the wrong counter, or MB shown without its scale."""
    out = io.StringIO()
    progress = Progress("job", [Counter("bytes", "MB", 1e6)], total=200.0,
                        total_key="source", stream=out)
    progress._start -= 10.0  # pretend 10 s have passed: rates become exact
    progress.update(bytes=5e6, source=50.0)
    line = progress.render()
    assert line.startswith("job  25%")
    assert "5 MB (0.5/s)" in line
    assert "ETA 0:30" in line  # 10 s for 25% -> 30 s for the remaining 75%


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

    assert [_human(v) for v in (812.1, 5.0, 0.5, 1234567, 4.2e9)] == [
        "812", "5", "0.5", "1.23M", "4.2G"]
