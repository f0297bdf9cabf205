"""``trainer plot RUN``: a run's curves from its ``metrics.jsonl``, as one PNG.

Four panels against the step: loss (train, valid, and each dataset's where the records have
per-source losses), learning rate, gradient norm, throughput with MFU; every panel marks the
steps where the run rolled back, met a spike it could not roll back, or skipped a
non-finite step. ``plot_series`` extracts what each panel draws (testable without pixels);
``plot_run`` draws it.

matplotlib is an optional extra (``pip install 'bloomline-trainer[plot]'``): training runs
without it. The figure is drawn with matplotlib's object API on the Agg canvas (no pyplot, no
display, no global state) and written atomically.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes, check_not_inside_foreign
from bloomline.common.errors import UserError
from bloomline.common.output_lock import output_lock
from bloomline.trainer.reporting.records import latest_per_step, read_records

__all__ = ["INSTALL_HINT", "PLOT_FILE", "plot_run", "plot_series", "require_matplotlib"]

PLOT_FILE = "plot.png"
INSTALL_HINT = ("trainer plot needs matplotlib, an optional extra: "
                "pip install 'bloomline-trainer[plot]' (or pip install matplotlib)")
SIZE_INCHES, DPI = (12.0, 8.0), 100  # 1200 x 800 pixels
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def require_matplotlib() -> type:
    """matplotlib's ``Figure`` class, or the one-line error saying how to install the extra."""
    try:
        # optional dependency (the plot extra): only this command needs it
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return Figure


def _finite(value) -> float:
    """A number to draw: a non-finite or missing one becomes NaN (a gap in the line)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) \
        else math.nan


def _series(records: list[dict], key: str, scale: float = 1.0) -> tuple[list, list]:
    """(steps, values) of ``key`` over the records that have it."""
    have = [r for r in records if key in r]
    return [r["step"] for r in have], [_finite(r[key]) * scale for r in have]


def plot_series(records: list[dict]) -> dict:
    """What each panel draws, from a run's records (``records.read_records``), one
    record per step (the last written):

    - ``loss``: ``{label: (steps, values)}``, labels ``train`` (each record's ``loss``: the
      mean over its log interval), ``valid``, ``train NAME`` and ``valid NAME`` for
      per-source losses (the log step's own);
    - ``lr``, ``grad_norm``, ``tokens_per_s``, ``mfu_percent``: (steps, values);
    - ``rollbacks``, ``spikes``: the steps of those events; ``skipped``: the log steps whose
      count of skipped (non-finite) steps rose since the previous train record.
    """
    train = latest_per_step(records, "train")
    valid = latest_per_step(records, "valid")
    loss = {"train": _series(train, "loss")}
    if any("valid_loss" in r for r in valid):
        loss["valid"] = _series(valid, "valid_loss")
    for split, rows in (("train", train), ("valid", valid)):
        prefix = f"{split}_loss/"
        names = sorted({k[len(prefix):] for r in rows for k in r if k.startswith(prefix)})
        for name in names:
            loss[f"{split} {name}"] = _series(rows, prefix + name)
    skipped, before = [], 0
    for record in train:
        count = record.get("skipped_steps") or 0
        if count > before:
            skipped.append(record["step"])
        before = count
    events = {kind: sorted({r["step"] for r in records if r["kind"] == kind})
              for kind in ("rollback", "spike")}
    return {"loss": loss, "lr": _series(train, "lr"), "grad_norm": _series(train, "grad_norm"),
            "tokens_per_s": _series(train, "tokens_per_s"),
            "mfu_percent": _series(train, "mfu", 100.0),
            "rollbacks": events["rollback"], "spikes": events["spike"], "skipped": skipped}


def _check_output(out: Path, default: Path, overwrite: bool) -> None:
    """The output rule: a ``.png`` path; the run's own ``RUN/plot.png`` is redrawn each time,
    another existing file only with ``overwrite`` and only when it is a PNG; and no other
    file goes into a checkpoint, a run folder or a corpus folder (a checkpoint with a file
    its manifest does not list fails verification)."""
    if out.suffix.lower() != ".png":
        raise UserError(f"--output {out}: must end in .png (the plot is a PNG)")
    if out.resolve() != default.resolve():
        check_not_inside_foreign(out)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() or out.is_symlink():
        raise UserError(f"--output {out}: is a {'link' if out.is_symlink() else 'folder'}; "
                        "choose a file name")
    with out.open("rb") as fh:
        is_png = fh.read(len(_PNG_MAGIC)) == _PNG_MAGIC
    if not is_png:
        raise UserError(f"--output {out}: exists and is not a PNG; not replaced, with or "
                        "without --overwrite (remove it yourself or choose another name)")
    if out.resolve() != default.resolve() and not overwrite:
        raise UserError(f"--output {out}: output exists; pass --overwrite to replace it")


def plot_run(run_dir: str | Path, out: str | Path | None = None,
             overwrite: bool = False) -> dict:
    """Draw ``run_dir``'s metrics into ``out`` (default ``RUN/plot.png``, redrawn each time).

    Returns ``out``, the numbers of train and valid records drawn, their first and last step,
    the rollback, spike and skip markers and ``bad_lines`` (lines of metrics.jsonl that did
    not parse: a line cut short by a killed process).

    Raises:
        UserError: matplotlib missing, no run folder or no ``metrics.jsonl``, no train record
            yet, or an output that may not be written.
    """
    figure_class = require_matplotlib()
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    default = run_dir / PLOT_FILE
    out = default if out is None else Path(out)
    with output_lock(out):  # one writer of the image; checked again under the lock
        _check_output(out, default, overwrite)
        return _plot_into(figure_class, run_dir, records, out, default, overwrite)


def _plot_into(figure_class: type, run_dir: Path, records, out: Path, default: Path,
               overwrite: bool) -> dict:
    series = plot_series(records)
    steps = series["loss"]["train"][0]
    if not steps:
        bad = (f"; {len(records.bad_lines)} lines did not parse (first: line "
               f"{records.bad_lines[0]})" if records.bad_lines else "")
        raise UserError(f"{records.path}: no train records to plot yet (the first is written "
                        f"when the run's first step ends){bad}")
    figure = figure_class(figsize=SIZE_INCHES, layout="constrained")
    _draw(figure, series, run_dir)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    atomic_write_bytes(out, buffer.getvalue(),
                       overwrite=overwrite or out.resolve() == default.resolve())
    valid = series["loss"].get("valid", ([], []))[0]
    return {"out": str(out), "train_records": len(steps), "first_step": steps[0],
            "last_step": steps[-1], "valid_records": len(valid),
            "rollbacks": series["rollbacks"], "spikes": series["spikes"],
            "skipped": series["skipped"], "bad_lines": records.bad_lines}


def _draw(figure, series: dict, run_dir: Path) -> None:
    (loss, lr), (norm, speed) = figure.subplots(2, 2, sharex=True)
    for label, (steps, values) in series["loss"].items():
        dashed = label.startswith("valid")
        loss.plot(steps, values, label=label, linestyle="--" if dashed else "-",
                  marker="o" if dashed and len(steps) < 30 else None, markersize=3)
    figure.suptitle(str(run_dir))
    loss.set(ylabel="loss", title="loss")
    lr.plot(*series["lr"])
    lr.set(ylabel="learning rate", title="learning rate")
    lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    norm.plot(*series["grad_norm"])
    norm.set(ylabel="gradient norm (before clipping)", title="gradient norm", xlabel="step")
    speed.plot(*series["tokens_per_s"], label="tokens/s")
    speed.set(ylabel="tokens/s", title="throughput and MFU", xlabel="step")
    mfu = speed.twinx()
    # dashed: with one peak the two curves are proportional and would hide each other
    mfu.plot(*series["mfu_percent"], color="tab:orange", linestyle="--", label="MFU %")
    mfu.set(ylabel="MFU (%)")
    speed.legend(handles=speed.get_lines() + mfu.get_lines(), fontsize="small",
                 loc="lower right")
    markers = (("rollbacks", "rollback", "tab:red", "--"),
               ("spikes", "spike kept", "tab:orange", ":"),
               ("skipped", "skipped step", "tab:gray", ":"))
    for axes in (loss, lr, norm, speed):
        for key, label, color, style in markers:
            for number, step in enumerate(series[key]):
                axes.axvline(step, color=color, linestyle=style, linewidth=1,
                             label=label if axes is loss and number == 0 else None)
    # beside the panel, not on it: with per-dataset losses (two lines per dataset) no corner
    # of the panel is free of curves; constrained layout narrows the column to make room
    loss.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                borderaxespad=0.0)
