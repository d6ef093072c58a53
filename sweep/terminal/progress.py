"""A run's progress: tqdm's bar on a terminal; off one (a batch job's log), one plain line every
`interval` seconds and at the end, with no carriage return.

tqdm cannot do the second: off a terminal it either writes its carriage-return updates into the
log or (`disable=None`) nothing at all, so the plain line is written here.

A run may add a `Note` to its progress (`note`, asked at each line, and every few seconds for
the bar): a text (the models in training, their epoch and validation score) and a better ETA
than the task rate's (a run that trains first finishes its first tasks slowly: its rate
understates what comes after).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO

from tqdm import tqdm

INTERVAL_S = 30.0
"""Seconds between two plain lines off a terminal (the last line is written at the end)."""


@dataclass(frozen=True)
class Counts:
    """A run's counts so far, as a `Note` is asked for them: tasks done and failed, all of them,
    the training tasks among them (done or failed, and all), and the seconds since the start."""

    done: int
    failed: int
    total: int
    training_finished: int
    training_total: int
    elapsed: float


@dataclass(frozen=True)
class Note:
    """What a run adds to its progress: `text` after the counts, and `remaining_s`, the ETA it
    gives instead of the task rate's (None: the rate's; NaN: unknown; with `at_least`, a lower
    bound: `ETA > 3m10s`)."""

    text: str = ""
    remaining_s: float | None = None
    at_least: bool = False


Noter = Callable[[Counts], Note]


class Progress(Protocol):
    """What a run's loop calls: `update` per finished task (`failed`: it failed; `training`: it
    was a training task), `close` once."""

    def update(self, n: int = 1, *, failed: int = 0, training: bool = False) -> None: ...

    def close(self, final: bool = True) -> None: ...


def duration(seconds: float) -> str:
    """`1h02m03s`, `4m05s`, `7s`: a plain-line duration."""
    s = max(0, round(seconds))
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class LineProgress:
    """One plain line once `interval` seconds have passed since the last (checked at each
    update and, with `heartbeat`, by a background thread, so a log hears from a run whose tasks
    are long) and one at `close`:
    `sweep: 120/275 tasks done, 150 pending, 5 failed, 1.40 tasks/s, ETA 1m47s`."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO, *,
                 interval: float = INTERVAL_S, heartbeat: bool = False,
                 clock: Callable[[], float] = time.monotonic, note: Noter | None = None,
                 training_total: int = 0) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.interval, self.clock, self.note = interval, clock, note
        self.done = self.failed = self.training_finished = 0
        self.training_total = training_total
        self.start = self.last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name="progress", daemon=True)
            self._thread.start()

    def counts(self) -> Counts:
        """The counts so far (for a `Note`)."""
        return Counts(self.done, self.failed, self.total, self.training_finished,
                      self.training_total, self.clock() - self.start)

    def line(self) -> str:
        """The current counts, rate and remaining time as one line, then the note's text."""
        counts = self.counts()
        note = self.note(counts) if self.note is not None else Note()
        finished = counts.done + counts.failed
        rate = finished / counts.elapsed if counts.elapsed > 0 else 0.0
        pending = self.total - finished
        text = f"; {note.text}" if note.text else ""
        return (f"{self.desc}: {self.done}/{self.total} {self.unit}s done, {pending} pending, "
                f"{self.failed} failed, {rate:.2f} {self.unit}s/s, "
                f"{remaining(pending, rate, counts.elapsed, note)}{text}")

    def tick(self) -> None:
        """Write the line if `interval` seconds have passed since the last one."""
        with self._lock:
            if self.clock() - self.last >= self.interval:
                self._write()

    def _write(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last = self.clock()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval / 4):
            self.tick()

    def update(self, n: int = 1, *, failed: int = 0, training: bool = False) -> None:
        with self._lock:
            self.done += n - failed
            self.failed += failed
            self.training_finished += n if training else 0
        self.tick()

    def close(self, final: bool = True) -> None:
        """Stop the heartbeat; write the last line unless the run failed (`final` False: its
        error is the last line)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final:
            with self._lock:
                self._write()


def remaining(pending: int, rate: float, elapsed: float, note: Note) -> str:
    """`elapsed 1m00s` when nothing is pending, else `ETA 2m00s` (the note's, else the rate's)
    or `ETA unknown`."""
    if pending == 0:
        return f"elapsed {duration(elapsed)}"
    seconds = note.remaining_s if note.remaining_s is not None else (
        pending / rate if rate > 0 else math.nan)
    if math.isnan(seconds):
        return "ETA unknown"
    return f"ETA {'> ' if note.at_least else ''}{duration(seconds)}"


BAR_REFRESH_S = 2.0
"""Seconds between two refreshes of the bar's note (its models in training, its ETA)."""


class BarProgress:
    """tqdm's bar (a terminal), with the failed count beside it once one failed; with a `note`,
    the note's ETA and text instead of tqdm's remaining time, refreshed every BAR_REFRESH_S."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO, *,
                 note: Noter | None = None, training_total: int = 0) -> None:
        form = None if note is None else "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=stream, bar_format=form)
        self.failed = self.training_finished = 0
        self.note, self.training_total = note, training_total
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if note is not None:
            self._thread = threading.Thread(target=self._beat, name="progress", daemon=True)
            self._thread.start()

    def _postfix(self) -> str:
        parts = [f"failed={self.failed}"] if self.failed else []
        if self.note is not None:
            elapsed = self.bar.format_dict["elapsed"]
            done = self.bar.n - self.failed
            counts = Counts(done, self.failed, self.bar.total, self.training_finished,
                            self.training_total, elapsed)
            note = self.note(counts)
            rate = self.bar.n / elapsed if elapsed > 0 else 0.0
            parts.append(remaining(self.bar.total - self.bar.n, rate, elapsed, note))
            parts += [note.text] if note.text else []
        return ", ".join(parts)

    def _beat(self) -> None:
        while not self._stop.wait(BAR_REFRESH_S):
            with self._lock:
                self.bar.set_postfix_str(self._postfix())

    def update(self, n: int = 1, *, failed: int = 0, training: bool = False) -> None:
        with self._lock:
            self.failed += failed
            self.training_finished += n if training else 0
            if failed or self.note is not None:
                self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.update(n)

    def close(self, final: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.close()


class NoProgress:
    """`--no-progress`: nothing."""

    def update(self, n: int = 1, *, failed: int = 0, training: bool = False) -> None:
        pass

    def close(self, final: bool = True) -> None:
        pass


def progress(total: int, desc: str, unit: str, *, enabled: bool = True,
             stream: TextIO | None = None, interval: float | None = None,
             note: Noter | None = None, training_total: int = 0) -> Progress:
    """The progress reporter for `stream` (default stderr): a bar on a terminal, plain lines
    every `interval` seconds (default INTERVAL_S) off one, nothing when not `enabled`; `note`
    adds to it (`training_total`: the training tasks among the `total`)."""
    stream = sys.stderr if stream is None else stream
    interval = INTERVAL_S if interval is None else interval
    if not enabled:
        return NoProgress()
    if stream.isatty():
        return BarProgress(total, desc, unit, stream, note=note, training_total=training_total)
    return LineProgress(total, desc, unit, stream, interval=interval, heartbeat=True, note=note,
                        training_total=training_total)
