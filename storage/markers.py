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
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from storage.integrity import MARKERS, Checksums, parse_marker
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
