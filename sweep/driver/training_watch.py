"""The models a run trains, as the store says they train: the progress's note and its ETA.

Training runs inside a preparation task on a worker; its epochs cross to the driver through the
store (`storage.markers`: each training writes a small record after its epochs, at most every
few seconds, and deletes it when done). The store is the one thing the driver, every worker and
`sweep status` share on every cluster kind (a local cluster, SLURM, Kubernetes pods with an
object store), so one record serves the run's progress and `sweep status` alike; Dask's worker
events would reach this driver only. The watch reads the records at most every `poll_s`
seconds (one listing and a read per model in training).

The ETA while models train: the time the trainings still need (each model in training: its
epochs left at its own pace, `TrainingProgress.remaining_s`; each not started yet: the mean
measured cost of those seen so far, divided among the trainings running at once), plus the other
pending tasks at the other tasks' rate measured over the time no training ran. Without a
measured cost yet, the ETA is unknown rather than a guess; without a rate of the other tasks yet,
it is at least the training left (`ETA > …`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from storage.location import StoreLike
from storage.markers import TrainingProgress, read_progress
from sweep.config.checkpoints import CHECKPOINT_NAME
from sweep.terminal.progress import Counts, Note, duration

POLL_S = 5.0
"""Seconds between two reads of the store's training records."""


def training_run(model: str) -> str:
    """The training run `model` measures: a checkpoint model's (`<name>@epoch<k>`) is its
    trained model's, whose one run keeps every epoch (`sweep.config.checkpoints`)."""
    match = CHECKPOINT_NAME.match(model)
    return match["model"] if match and match["epoch"] is not None else model


class TrainingWatch:
    """The trainings of one run's preparation tasks (`models`), read from `store` (see the
    module); `note` is the progress's `Noter`. Models of one training run (its checkpoints)
    count once: the first to finish trains it, the others find it in the cache."""

    def __init__(self, store: StoreLike, models: Iterable[str], *, poll_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.models = store, list(models)
        self.runs = list(dict.fromkeys(training_run(m) for m in self.models))
        self.poll_s, self.clock = POLL_S if poll_s is None else poll_s, clock
        self.active: dict[str, TrainingProgress] = {}  # run -> its latest record
        self.costs: dict[str, float] = {}  # run -> wall seconds its training took
        self.finished: set[str] = set()  # runs
        self.busy_s = 0.0  # seconds during which some model trained, up to `counted_to`
        self.counted_to = clock()
        self.read_at: float | None = None
        self._lock = threading.Lock()

    def done(self, model: str) -> None:
        """`model`'s preparation ended (its record is gone with it): its measured cost is its
        last record's time plus the time since that record was read."""
        run = training_run(model)
        with self._lock:
            self._count_busy()
            self.finished.add(run)
            last = self.active.pop(run, None)
            if last is not None:
                self.costs[run] = last.elapsed_s + self.clock() - (self.read_at or self.clock())

    def poll(self) -> None:
        """Read the records if `poll_s` has passed since the last read."""
        now = self.clock()
        if self.read_at is not None and now - self.read_at < self.poll_s:
            return
        records = read_progress(self.store)
        with self._lock:
            self._count_busy()
            self.read_at = now
            self.active = {}
            for model in self.models:
                run = training_run(model)
                if model in records and run not in self.finished:
                    if run not in self.active or records[model].updated > self.active[run].updated:
                        self.active[run] = records[model]

    def _count_busy(self) -> None:
        """Add the time since `counted_to` to `busy_s` if a model was training (under the lock)."""
        now = self.clock()
        if self.active:
            self.busy_s += now - self.counted_to
        self.counted_to = now

    def note(self, counts: Counts) -> Note:
        """The note of the progress now (see the module)."""
        self.poll()
        with self._lock:
            active, costs = dict(self.active), dict(self.costs)
            busy, finished = self.busy_s, len(self.finished)
        waiting = len(self.runs) - finished - len(active)
        if not active and not waiting:
            return Note()
        seen = [*costs.values(), *(p.elapsed_s + p.remaining_s() for p in active.values())]
        each = sum(seen) / len(seen) if seen else math.nan
        training = (sum(p.remaining_s() for p in active.values())
                    + (waiting * each if waiting else 0.0)) / max(1, len(active))
        others = counts.done + counts.failed - counts.training_finished
        pending = (counts.total - counts.done - counts.failed
                   - (counts.training_total - counts.training_finished))
        free = counts.elapsed - busy
        rate = others / free if others and free > 0 else math.nan
        rest = 0.0 if pending <= 0 else pending / rate
        unknown_rest = math.isnan(rest) and not math.isnan(training)
        parts = [p.line() for p in active.values()]
        text = ("training " + ", ".join(parts) if parts else "training starts") + (
            f"; {finished} of {len(self.runs)} trained"
            + (f" ({duration(sum(costs.values()) / len(costs))} each)" if costs else ""))
        return Note(text, training if unknown_rest else training + rest, at_least=unknown_rest)
