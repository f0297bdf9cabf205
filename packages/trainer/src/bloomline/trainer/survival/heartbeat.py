"""A rank that stops answering is named while the others wait for it, long before their
collective times out: every rank publishes a heartbeat (where it is: its step and section, its
host and pid, a counter) into torchrun's store from a daemon thread, and rank 0 reads everyone's.

Two findings, each named once per episode on the console and as a ``watchdog`` record in
``metrics.jsonl`` (``event``: ``silent`` / ``answered`` / ``stuck`` / ``moved``):

- silent: a rank's heartbeat has not changed for ``watchdog.silent_seconds``: its process is
  stopped (SIGSTOP, a debugger, swapped out), dead, or its Python cannot run (a C call holding
  the GIL). When it beats again: "answers again after N s".
- stuck: a rank still beats but has stayed in one section of one step for
  ``watchdog.silent_seconds`` while another rank has been past it as long: the others wait
  for it in a collective (a hung read in its data wait, a loop that never ends). When it
  moves: "moved on". Ranks that all wait in the same place (a long step, a collective
  everyone is in) are not named.

Rank 0 watches every other rank; rank 1 watches rank 0 (and prints what it finds: only rank 0
writes files). The ages are measured on the watcher's own monotonic clock (when it saw a
heartbeat change), never by comparing hosts' clocks. A watcher that was itself frozen (its
ticks came late) starts the ages again instead of naming everyone.

Timing: a heartbeat every ``silent_seconds / 10`` (at most 1 s, at least 0.05 s), so a
rank is named between ``silent_seconds`` and that plus a beat after it stopped. The default
60 s is well under what ends a hung run otherwise: the per-process watchdog's
``watchdog.floor_seconds`` (600 s) and the collectives' own timeout (torch's default, which
``init_distributed`` keeps: 10 min for NCCL, 30 min for gloo).

The store: the default process group's (torchrun's TCPStore), through a clone of it: a
connection of this thread's own. A TCPStore client serializes its operations under one lock
held for the whole operation (``activeOpLock_`` in torch's TCPStore.hpp), so sharing the main
thread's client would stall the heartbeat behind a long ``wait`` of the main thread (a new
group's setup) and name a healthy rank. The keys carry torchrun's restart count: an earlier
attempt's heartbeats are never read as this one's. Cost: one ``set`` of about 100 bytes per
rank per beat, and on rank 0 one ``multi_get`` of the world's keys per beat.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

__all__ = ["Heartbeat", "beat_interval"]

_PREFIX = "bloomline/heartbeat"
_DONE = "done"  # the section of a rank's last heartbeat, when its run ended


def beat_interval(silent_seconds: float) -> float:
    """Seconds between heartbeats for ``watchdog.silent_seconds``."""
    return min(1.0, max(0.05, silent_seconds / 10))


def _where(step: int, section: str) -> str:
    """``in step 57, forward``; ``between steps (after step 57)`` in section ``other``
    (logging, evaluation, a checkpoint)."""
    if section == "start" or (section == "other" and step <= 1):
        return "before the first step (the run's start: its build, a checkpoint's load)"
    if section == "other":
        return f"between steps (after step {step - 1})"
    return f"in step {step}, {section}"


@dataclass
class _Watched:
    """What the watcher knows of one rank."""

    rank: int
    value: bytes | None = None
    changed_at: float = 0.0  # when its heartbeat last changed (the watcher's clock)
    moved_at: float = 0.0  # when its position last changed
    beat: dict = field(default_factory=dict)
    named: str = ""  # "silent" or "stuck" while an episode lasts
    since: float = 0.0  # when the episode began
    behind_since: float | None = None  # since when another rank has been past it

    def position(self) -> tuple[int, int]:
        return int(self.beat.get("step", 0)), int(self.beat.get("entries", 0))


class Heartbeat:
    """One rank's heartbeat and, on ranks 0 and 1, its watch over others.

    Args:
        rank: This process's rank in the torchrun world.
        silent_seconds: ``watchdog.silent_seconds``; 0 (or a world of one): no heartbeat.
    """

    def __init__(self, rank: int, silent_seconds: float) -> None:
        self.rank, self.silent_seconds = rank, silent_seconds
        self.interval = beat_interval(silent_seconds) if silent_seconds > 0 else 0.0
        self._log: Callable[[str], None] = lambda _line: None
        self._write: Callable[[dict], None] = lambda _record: None
        self._where = (0, "start", 0)  # (step, section, entries): replaced whole
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store = None
        self._attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._me = {"host": socket.gethostname(), "pid": os.getpid()}
        self._watched: list[_Watched] = []

    @classmethod
    def from_config(cls, cfg, rank: int) -> Heartbeat:
        return cls(rank, cfg.watchdog.silent_seconds)

    def report_to(self, log: Callable[[str], None], write: Callable[[dict], None]) -> None:
        """Where findings go: console lines (``log``, called on the watching ranks) and
        records (``write``: rank 0's metrics sink)."""
        self._log, self._write = log, write

    def at(self, step: int, section: str, entries: int) -> None:
        """This rank is in ``section`` of ``step``, its ``entries``-th section of the step
        (main thread; the heartbeat thread reads the tuple, replaced whole: never torn)."""
        self._where = (step, section, entries)

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """Begin beating (after ``init_distributed``; the run's start)."""
        import torch.distributed as dist

        if (not self.silent_seconds or self._thread is not None or not dist.is_available()
                or not dist.is_initialized() or dist.get_world_size() == 1):
            return
        world_size = dist.get_world_size()
        watched = (range(1, world_size) if self.rank == 0 else [0] if self.rank == 1 else [])
        self._watched = [_Watched(r) for r in watched]
        # a private API, stable since torch 2.0: the store init_process_group connected to
        store = dist.distributed_c10d._get_default_store().clone()
        # a dead store (torchrun's agent gone) must not keep this thread in one call for the
        # default 30 min: the run is ending anyway, the next beat tries again
        store.set_timeout(timedelta(seconds=max(5.0, 2 * self.interval)))
        self._store = store
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bloomline-heartbeat",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop beating (the run's end; every rank's finding on the way out is moot)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():  # the store is this thread's now
            try:  # the watchers stop watching a rank that ended its run
                self._beat(-1, _DONE)
            except Exception:  # noqa: BLE001 - the store is gone: nobody watches either
                pass
        self._thread = None
        self._store = None

    def _beat(self, count: int, section: str = "") -> None:
        step, here, entries = self._where
        self._store.set(self._key(self.rank), json.dumps(
            {"n": count, "step": step, "section": section or here, "entries": entries,
             **self._me}))

    def _key(self, rank: int) -> str:
        return f"{_PREFIX}/{self._attempt}/{rank}"

    def _run(self) -> None:
        count = 0
        ticked = time.monotonic()
        for rank in self._watched:
            rank.changed_at = rank.moved_at = ticked
        while True:
            count += 1
            try:
                self._beat(count)
                if self._watched:
                    values = self._read()
                    now = time.monotonic()
                    if now - ticked > max(self.silent_seconds / 2, 3 * self.interval):
                        # this process was frozen or starved: its ages say nothing of others
                        for rank in self._watched:
                            rank.changed_at = rank.moved_at = now
                            rank.behind_since = None
                    self._judge(values, now)
                    ticked = now
            except Exception:  # noqa: BLE001 - the store is gone or slow: the run is ending
                pass  # or recovering; never let the heartbeat end a run
            if self._stop.wait(self.interval):
                return

    def _read(self) -> dict[int, bytes]:
        """The watched ranks' heartbeats that exist (a rank that has not beaten yet has no
        key; a ``get`` of it would wait for it)."""
        store = self._store
        ranks = [w.rank for w in self._watched]
        keys = [self._key(r) for r in ranks]
        if store.check(keys):
            return dict(zip(ranks, store.multi_get(keys), strict=True))
        return {r: store.get(k) for r, k in zip(ranks, keys, strict=True) if store.check([k])}

    def _judge(self, values: dict[int, bytes], now: float) -> None:
        for w in self._watched:
            value = values.get(w.rank)
            if value is not None and value != w.value:
                beat = json.loads(value)
                if (beat.get("step"), beat.get("entries")) != (w.beat.get("step"),
                                                               w.beat.get("entries")):
                    w.moved_at = now
                w.value, w.changed_at, w.beat = value, now, beat
        # where the ranks that still run are: one past another means that one waits
        step, _, entries = self._where
        running = [w for w in self._watched if now - w.changed_at <= self.silent_seconds
                   and w.beat.get("section") != _DONE]
        furthest = max([w.position() for w in running] + [(step, entries)])
        for w in self._watched:
            if w.beat.get("section") == _DONE:  # ended its run: nobody waits for it
                w.named = ""
                continue
            silent = now - w.changed_at > self.silent_seconds
            if w.named == "silent" and not silent:  # back: its stay was the silence, not
                w.moved_at = now  # a stuck section (its first beat may show the old place)
            # another rank past it for a while, not for a heartbeat's lag: a rank that just
            # left a collective is past one whose newest beat still shows it waiting there
            if furthest <= w.position():
                w.behind_since = None
            elif w.behind_since is None:
                w.behind_since = now
            stuck = (not silent and w.value is not None and w.behind_since is not None
                     and now - max(w.moved_at, w.behind_since) > self.silent_seconds)
            if w.named == "silent" and not silent:
                self._report(w, "answered", now - w.since)
            elif w.named == "stuck" and not stuck and not silent:
                self._report(w, "moved", now - w.since)
            if silent and w.named != "silent":
                w.since = w.changed_at
                self._report(w, "silent", now - w.since)
            elif stuck and w.named != "stuck":
                w.since = w.moved_at
                self._report(w, "stuck", now - w.since)
            w.named = "silent" if silent else "stuck" if stuck else ""

    def _report(self, w: _Watched, event: str, seconds: float) -> None:
        beat = w.beat
        who = (f"rank {w.rank} (host {beat['host']}, pid {beat['pid']})" if beat
               else f"rank {w.rank}")
        where = _where(beat.get("step", 0), beat.get("section", "start")) if beat else ""
        if event == "silent":
            seen = f"last seen {where}" if beat else "not seen since the run started"
            line = (f"has not answered for {seconds:.0f} s ({seen}); the other ranks wait for "
                    "it at their next collective")
        elif event == "answered":
            line = f"answers again after {seconds:.0f} s (now {where})"
        elif event == "stuck":
            line = (f"has been {where} for {seconds:.0f} s while others are past it; they "
                    "wait for it in a collective")
        else:
            line = f"moved on after {seconds:.0f} s (now {where})"
        self._log(f"watchdog: {who} {line}")
        self._write({"kind": "watchdog", "step": int(beat.get("step", 0)), "event": event,
                     "rank": w.rank, "host": beat.get("host", ""), "pid": beat.get("pid", 0),
                     "section": beat.get("section", ""), "seconds": round(seconds, 1)})
