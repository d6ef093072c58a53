"""What one training run writes while it runs: the epochs it keeps, as it reaches them; a resume
point at most every RESUME_EVERY_S seconds; its progress, at most every REPORT_EVERY_S.

A resume point is everything the epoch loop needs to go on as if never stopped (every module's
weights, the optimiser's and the schedule's state, the random generators, the history, the best
epoch so far and its weights): `<stem>.resume.safetensors` beside the run's kept weights in the
cache, its JSON part in the file's metadata. A run killed after one resumes from it, to the same
bits as a run never stopped (`tests/test_training_resume.py`); the point is deleted once the run's
kept weights and record are written. Without a cache (`TrainingRun()`: a recipe called
directly) nothing is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch
from safetensors.torch import load, save

from storage.errors import StoreDamagedError
from storage.location import Location
from storage.markers import TrainingProgress
from workers.inputs import Table
from workers.models.trained.cache import epoch_key, weights_bytes

RESUME_EVERY_S = 30.0
"""Seconds of training between two resume points (a kill loses at most this much training)."""
REPORT_EVERY_S = 5.0
"""Seconds between two progress records (the first and the last epoch are always reported)."""
Reporter = Callable[[TrainingProgress], None]


def resume_key(key: str) -> str:
    """The resume point of the run whose kept weights are `key`."""
    return key.removesuffix(".safetensors") + ".resume.safetensors"


class TrainingRun:
    """One training run's writes (see the module): `location`/`key`/`table` name its place in
    the cache (None: write nothing), `write_epochs` the kept epochs not cached yet, `report`
    where its progress goes (None: nowhere), `clock` the time it is measured by."""

    def __init__(self, location: Location | None = None, key: str = "", table: Table | None = None,
                 write_epochs: set[int] | None = None, report: Reporter | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.location, self.key, self.table = location, key, table
        self.write_epochs = set(write_epochs or ())
        self.reporter, self.clock = report, clock
        self.saved_at = self.reported_at = clock()
        self.resume_epoch: int | None = None  # the epoch of the last resume point written or read

    def keep(self, epoch: int, weights: dict[str, torch.Tensor]) -> None:
        """Write the weights after `epoch` into the cache now, if the run is to write them."""
        if self.location is not None and epoch in self.write_epochs:
            self.location.write(epoch_key(self.key, epoch), weights_bytes(weights, self.table))

    def resume_point(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """The run's last resume point (tensors, JSON part), None when there is none;
        StoreDamagedError naming one that does not load."""
        data = None if self.location is None else self.location.read(resume_key(self.key))
        if data is None:
            return None
        try:
            tensors = load(data)
            meta = json.loads(_metadata(data)["resume"])
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
            raise StoreDamagedError(
                f"resume point {str(self.location).rstrip('/')}/{resume_key(self.key)} is "
                f"truncated or corrupt ({type(error).__name__}); delete it to train from the "
                f"start") from None
        self.resume_epoch = int(meta["epoch"])
        return tensors, meta

    def due(self, last: bool) -> bool:
        """Whether to write a resume point now: RESUME_EVERY_S since the last, and not after the
        last epoch (the run's own files follow at once)."""
        return (self.location is not None and not last
                and self.clock() - self.saved_at >= RESUME_EVERY_S)

    def save_point(self, epoch: int, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Write the resume point after `epoch` (replacing the last one)."""
        data = save({k: v.contiguous() for k, v in tensors.items()},
                    metadata={"resume": json.dumps({**meta, "epoch": epoch})})
        self.location.write(resume_key(self.key), data)
        self.saved_at, self.resume_epoch = self.clock(), epoch

    def clear(self) -> None:
        """Drop the resume point (the run's kept weights and record are written)."""
        if self.location is not None:
            self.location.delete(resume_key(self.key))

    def report(self, progress: TrainingProgress, last: bool) -> None:
        """Hand `progress` to the reporter: the first epoch run here, every REPORT_EVERY_S, and
        the last."""
        if self.reporter is None:
            return
        first = progress.epoch == (progress.resumed_from or 0) + 1
        if first or last or self.clock() - self.reported_at >= REPORT_EVERY_S:
            self.reporter(progress)
            self.reported_at = self.clock()


def _metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file's header."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__") or {}
