"""Reading a run's ``metrics.jsonl`` back: for the end-of-run summary and ``trainer plot``.

The file is appended to by every session of a run (resumes, restarts), so it may hold a line
cut short by a killed process (``metrics.py`` ends it before appending) and steps logged
twice (after a restart or a rollback the later record is the one that counts).
"""

from __future__ import annotations

import json
from pathlib import Path

from bloomline.common.errors import UserError

__all__ = ["METRICS_FILE", "Records", "latest_per_step", "read_records"]

METRICS_FILE = "metrics.jsonl"


class Records(list):
    """The records of a ``metrics.jsonl`` (dicts with ``kind`` and ``step``), in file order,
    and the 1-based numbers of the lines that did not parse as such (``bad_lines``)."""

    path: Path
    bad_lines: list[int]


def read_records(run_dir: str | Path) -> Records:
    """The records of ``RUN/metrics.jsonl``; lines that are not a JSON object with a ``kind``
    and an integer ``step`` (a torn last line) are skipped and counted in ``bad_lines``.

    Raises:
        UserError: ``run_dir`` is not a folder, or holds no ``metrics.jsonl``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run folder")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise UserError(f"{run_dir}: no {METRICS_FILE} (not a run folder, or its run has not "
                        "logged a step yet)")
    records = Records()
    records.path, records.bad_lines = path, []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if (isinstance(record, dict) and isinstance(record.get("kind"), str)
                    and isinstance(record.get("step"), int)):
                records.append(record)
            else:
                records.bad_lines.append(number)
    return records


def latest_per_step(records: list[dict], kind: str) -> list[dict]:
    """The records of ``kind``, one per step (the last written), in step order."""
    latest = {r["step"]: r for r in records if r["kind"] == kind}
    return [latest[step] for step in sorted(latest)]
