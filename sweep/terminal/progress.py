"""A run's progress: tqdm's bar on a terminal; off one (a batch job's log), one plain line every
`interval` seconds and at the end, with no carriage return.

tqdm cannot do the second: off a terminal it either writes its carriage-return updates into the
log or (`disable=None`) nothing at all, so the plain line is written here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, TextIO

from tqdm import tqdm

INTERVAL_S = 30.0
"""Seconds between two plain lines off a terminal (the last line is written at the end)."""


class Progress(Protocol):
    """What a run's loop calls: `update` per finished task (`failed`: it failed), `close` once."""

    def update(self, n: int = 1, *, failed: int = 0) -> None: ...

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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.interval, self.clock = interval, clock
        self.done = self.failed = 0
        self.start = self.last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name="progress", daemon=True)
            self._thread.start()

    def line(self) -> str:
        """The current counts, rate and remaining time as one line."""
        finished = self.done + self.failed
        elapsed = self.clock() - self.start
        rate = finished / elapsed if elapsed > 0 else 0.0
        pending = self.total - finished
        if pending == 0:
            tail = f"elapsed {duration(elapsed)}"
        else:
            tail = f"ETA {duration(pending / rate)}" if rate > 0 else "ETA unknown"
        return (f"{self.desc}: {self.done}/{self.total} {self.unit}s done, {pending} pending, "
                f"{self.failed} failed, {rate:.2f} {self.unit}s/s, {tail}")

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

    def update(self, n: int = 1, *, failed: int = 0) -> None:
        with self._lock:
            self.done += n - failed
            self.failed += failed
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


class BarProgress:
    """tqdm's bar (a terminal), with the failed count beside it once one failed."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO) -> None:
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=stream)
        self.failed = 0

    def update(self, n: int = 1, *, failed: int = 0) -> None:
        if failed:
            self.failed += failed
            self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(n)

    def close(self, final: bool = True) -> None:
        self.bar.close()


class NoProgress:
    """`--no-progress`: nothing."""

    def update(self, n: int = 1, *, failed: int = 0) -> None:
        pass

    def close(self, final: bool = True) -> None:
        pass


def progress(total: int, desc: str, unit: str, *, enabled: bool = True,
             stream: TextIO | None = None, interval: float = INTERVAL_S) -> Progress:
    """The progress reporter for `stream` (default stderr): a bar on a terminal, plain lines
    off one, nothing when not `enabled`."""
    stream = sys.stderr if stream is None else stream
    if not enabled:
        return NoProgress()
    if stream.isatty():
        return BarProgress(total, desc, unit, stream)
    return LineProgress(total, desc, unit, stream, interval=interval, heartbeat=True)
