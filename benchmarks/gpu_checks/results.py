"""One row per check and the table they print; the tolerance test every numeric check uses.

Contract: a check returns one or more :class:`Row`; ``status`` is ``pass``, ``fail`` or
``skipped`` and ``detail`` says why (what failed, what was missing), ``figures`` what was
measured and ``tolerance`` what it was held to. :func:`relative_error` is the one comparison
of tensors: the largest absolute difference over the largest magnitude of the reference, so
that a tolerance reads as "a fraction of the tensor's scale" whatever its units.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["FAIL", "PASS", "SKIPPED", "Row", "exit_code", "format_table", "markdown",
           "relative_error", "write_results"]

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass(frozen=True)
class Row:
    """The result of one check (or one case of it)."""

    name: str
    status: str
    figures: str = ""
    tolerance: str = ""
    detail: str = ""


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, both in fp64 (a zero reference: the plain max |got|).

    A NaN or inf anywhere gives inf, so no tolerance passes it (``max`` would skip a NaN)."""
    import torch  # here: gpu_check imports this module before it knows this Python has torch

    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.shape != want.shape:
        raise ValueError(f"shapes differ: {tuple(got.shape)} vs {tuple(want.shape)}")
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()):
        return float("inf")
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got - want).abs().max().item() if want.numel() else 0.0
    return diff / scale if scale > 0 else diff


def exit_code(rows: list[Row]) -> int:
    """0 when nothing failed (skips allowed), 1 otherwise."""
    return 1 if any(row.status == FAIL for row in rows) else 0


def format_table(rows: list[Row]) -> list[str]:
    """The printed table: a header, a rule and one line per row, columns as wide as their
    widest cell; the detail, when there is one, in parentheses after the figures."""
    width = max([len("check"), *(len(row.name) for row in rows)])
    tol = max([len("tolerance"), *(len(row.tolerance) for row in rows)])
    header = f"{'check':<{width}}  {'status':<7}  {'tolerance':<{tol}}  figures"
    lines = [header, "-" * len(header)]
    for row in rows:
        text = row.figures + (f" ({row.detail})" if row.detail else "")
        lines.append(f"{row.name:<{width}}  {row.status:<7}  {row.tolerance:<{tol}}  {text}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def markdown(document: dict) -> str:
    """The results file's markdown: the machine, the time each check took against its
    budget, and the rows (``document`` as :func:`write_results` takes it)."""
    lines = [f"# GPU check, {document['date']}: {document['gpus']} x {document['gpu']}", "",
             "| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(str(value))} |" for key, value in document["machine"].items()]
    lines += ["", f"Command: `{document['command']}`; exit status {document['exit_status']}; "
              f"{document['total_s']:.0f} s in all.", "",
              "| check | seconds | budget (s) |", "|---|---|---|"]
    lines += [f"| {letter}: {entry['what']} | {entry['seconds']:.0f} | "
              f"{entry['budget_s'] if entry['budget_s'] is not None else 'none'} |"
              for letter, entry in document["timing"].items()]
    lines += ["", "| check | status | tolerance | figures |", "|---|---|---|---|"]
    for row in document["rows"]:
        text = row["figures"] + (f" ({row['detail']})" if row["detail"] else "")
        lines.append(f"| {_cell(row['name'])} | {row['status']} | {_cell(row['tolerance'])} | "
                     f"{_cell(text)} |")
    return "\n".join(lines) + "\n"


def write_results(prefix: Path, document: dict) -> list[Path]:
    """``PREFIX.md`` and ``PREFIX.json`` of one run of the checks. ``document``: ``date``,
    ``gpu``, ``gpus``, ``machine`` (name -> value), ``command``, ``exit_status``,
    ``total_s``, ``timing`` (letter -> what, seconds, budget_s) and ``rows`` (:class:`Row`
    or their dicts)."""
    document = dict(document, rows=[asdict(r) if isinstance(r, Row) else r
                                    for r in document["rows"]])
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md, js = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".json")
    md.write_text(markdown(document))
    js.write_text(json.dumps(document, indent=1) + "\n")
    return [md, js]
