"""Completion markers: one small object per (model or baseline, stage, index), written after data.

`.sweep/markers/<scope>/<stage>-<index>.done` (relative to the store's root, in a local folder or
on an object store: `storage.location`) vouches that the task's data is fully written: it holds
JSON `{"chunks": {key: [size, "crc32c:<hex>", version] or null}}`, the chunks the task wrote (see
`storage.integrity`; older markers hold `[size, sha256 hex]`, and a marker from before checksums
holds `done`). `.failed` holds the error of a task that kept failing: its `Type: message` line
first, then the traceback. Both are whole-object writes (a temporary file renamed into place
locally, one PUT remotely), so a marker is either absent or complete.

`MarkerIndex` is one listing of every marker, for the driver's start-up: whether each of
thousands of tasks is done costs one listing, not a request per task.

A task that trains also says how far it got while it runs, before its marker exists: one small
JSON object per model, `.sweep/training/<model>.json` (`TrainingProgress`), written after its
epochs (at most every few seconds: `workers.models.trained.run`) and deleted once its done
marker is written. The driver's progress (`sweep run`) and `sweep status` read them, so both see
the same thing on a local cluster, in one process, on SLURM or on Kubernetes (the store is the
one place every worker and the driver share). A record left by a task that failed or was killed
stays until the model's preparation runs again; `updated` says how old it is. A record: model,
epoch, epochs (the cap), `early_stopping` (True: training may end before the cap), `stop_by`
(the epoch at which it ends if no later epoch improves; the cap without early stopping), score
and value (the validation score of the last epoch), elapsed_s and cpu_s (this training so far),
`resumed_from` (the epoch this run resumed from, None: from the start), `resume_point` (the
epoch a kill would resume from, None: it would restart), updated (Unix time of the write).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from storage.errors import StoreDamagedError
from storage.integrity import MARKERS, Checksums, parse_marker
from storage.layout import BOOKKEEPING_DIR
from storage.location import StoreLike, locate, redact_url

DONE, FAILED = ".done", ".failed"


def marker_name(stage: str, index: int | str) -> str:
    """`extract-00003` for shards, `baseline-n0008-c00002` style names pass through as given."""
    return f"{stage}-{index:05d}" if isinstance(index, int) else f"{stage}-{index}"


def marker_key(scope: str, name: str, suffix: str = DONE) -> str:
    """The marker's key relative to the store's root."""
    return f"{MARKERS}{scope}/{name}{suffix}"


def mark_done(store: StoreLike, scope: str, name: str,
              chunks: Checksums | None = None) -> None:
    """Record that the task's data is complete, with the checksums of the chunks it wrote
    (`storage.integrity.checksums`); clears any earlier failure."""
    text = "done\n" if chunks is None else json.dumps({"chunks": chunks}, sort_keys=True) + "\n"
    location = locate(store)
    location.write(marker_key(scope, name), text.encode())
    location.delete(marker_key(scope, name, FAILED))


def mark_failed(store: StoreLike, scope: str, name: str, error: str) -> None:
    """Record the error of a task that failed after its retries (a URL's userinfo hidden)."""
    locate(store).write(marker_key(scope, name, FAILED),
                        (redact_url(error.rstrip()) + "\n").encode())


def clear(store: StoreLike, scope: str, name: str) -> None:
    """Forget a task's completion (its data is about to be rewritten)."""
    locate(store).delete(marker_key(scope, name))


def vouched_chunks(store: StoreLike, scope: str, name: str) -> Checksums | None:
    """The chunk checksums a done marker holds; None if there is no marker or it holds none
    (an unreadable marker vouches for nothing: {"(marker)": [-1, ...]} fails every check)."""
    key = marker_key(scope, name)
    data = locate(store).read(key)
    return None if data is None else parse_marker(data, key)


def is_done(store: StoreLike, scope: str, name: str) -> bool:
    """Whether the task's done marker exists."""
    return locate(store).info(marker_key(scope, name)) is not None


@dataclass(frozen=True)
class MarkerState:
    """Status of one task: `done`, `failed` (with its error) or `pending`."""

    state: str
    error: str | None = None


def read_state(store: StoreLike, scope: str, name: str) -> MarkerState:
    """The task's state as its markers say: done wins over failed, else pending."""
    if is_done(store, scope, name):
        return MarkerState("done")
    failed = locate(store).read(marker_key(scope, name, FAILED))
    if failed is not None:
        return MarkerState("failed", failed.decode(errors="replace").strip())
    return MarkerState("pending")


class MarkerIndex:
    """Every marker of a store from one listing: `done(scope, name)`, `failed(scope, name)`;
    `forget` keeps it in step with `clear`."""

    def __init__(self, store: StoreLike) -> None:
        self.store = locate(store)
        self.keys = set(self.store.listing(MARKERS))

    def done(self, scope: str, name: str) -> bool:
        return marker_key(scope, name) in self.keys

    def failed(self, scope: str, name: str) -> bool:
        return marker_key(scope, name, FAILED) in self.keys

    def clear(self, scope: str, name: str) -> None:
        """`clear` the marker in the store and in the index."""
        clear(self.store, scope, name)
        self.keys.discard(marker_key(scope, name))


# A training task's progress, while it trains (see the module).

PROGRESS_DIR = f"{BOOKKEEPING_DIR}/training/"


@dataclass(frozen=True)
class TrainingProgress:
    """One training run's state after its last reported epoch (see the module)."""

    model: str
    epoch: int
    epochs: int
    early_stopping: bool
    stop_by: int
    score: str
    value: float
    elapsed_s: float
    cpu_s: float
    resumed_from: int | None
    resume_point: int | None
    updated: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingProgress:
        return cls(**{f.name: data[f.name] for f in fields(cls)})

    def remaining_s(self) -> float:
        """Seconds to `stop_by` at this run's pace so far (its epochs and time, a resumed run's
        included)."""
        pace = self.elapsed_s / self.epoch if self.epoch else 0.0
        return max(0, self.stop_by - self.epoch) * pace

    def line(self) -> str:
        """`vit@seed0 epoch 12 of 40 (val_accuracy 0.9120)`; `of at most` with early stopping."""
        of = f"of at most {self.epochs}" if self.early_stopping else f"of {self.epochs}"
        return f"{self.model} epoch {self.epoch} {of} ({self.score} {self.value:.4f})"


def progress_key(model: str) -> str:
    """The record's key relative to the store's root."""
    return f"{PROGRESS_DIR}{model}.json"


def write_progress(store: StoreLike, progress: TrainingProgress) -> None:
    """Replace `progress.model`'s record (an atomic replace)."""
    data = json.dumps(progress.to_dict(), sort_keys=True).encode()
    locate(store).write(progress_key(progress.model), data)


def progress_writer(store: StoreLike, model: str) -> Callable[[TrainingProgress], None]:
    """A reporter writing each record it is handed as `model`'s (the sweep's name for it)."""
    return lambda progress: write_progress(store, replace(progress, model=model))


def clear_progress(store: StoreLike, model: str) -> None:
    """Drop `model`'s record (its training is over)."""
    locate(store).delete(progress_key(model))


def read_progress(store: StoreLike) -> dict[str, TrainingProgress]:
    """Model -> its record, for every model with one (one listing, then a read each);
    StoreDamagedError naming a record that does not parse."""
    location = locate(store)
    keys = sorted(key for key in location.listing(PROGRESS_DIR)  # not a write's temporary file
                  if key.endswith(".json") and not key.rpartition("/")[2].startswith("."))
    out = {}
    for key, data in location.read_many(keys).items():
        if data is None:  # deleted between the listing and the read: training ended
            continue
        try:
            progress = TrainingProgress.from_dict(json.loads(data))
        except (ValueError, KeyError, TypeError):
            raise StoreDamagedError(f"training progress {location}/{key} does not parse; "
                                    f"delete it (the next `sweep run` writes it again)") from None
        out[progress.model] = progress
    return out
