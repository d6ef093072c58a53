"""Completion markers: one small file per (model or baseline, stage, index), written after data.

`<store>/.sweep/markers/<scope>/<stage>-<index>.done` vouches that the task's data is fully
written: it holds JSON `{"chunks": {path: [size, "crc32c:<hex>", mtime_ns] or null}}`, the chunk
files the task wrote (see `storage.integrity`; older markers hold `[size, sha256 hex]`, and a
marker from before checksums holds `done`). `.failed` holds the
error of a task that kept failing: its `Type: message` line first, then the traceback. Both are
written atomically (temporary file, fsync, rename), so a marker is either absent or complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from storage.layout import BOOKKEEPING_DIR

DONE, FAILED = ".done", ".failed"


def marker_name(stage: str, index: int | str) -> str:
    """`extract-00003` for shards, `baseline-n0008-c00002` style names pass through as given."""
    return f"{stage}-{index:05d}" if isinstance(index, int) else f"{stage}-{index}"


def _path(store: Path, scope: str, name: str, suffix: str) -> Path:
    return Path(store) / BOOKKEEPING_DIR / "markers" / scope / f"{name}{suffix}"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def mark_done(store: Path, scope: str, name: str,
              chunks: dict[str, list | None] | None = None) -> None:
    """Record that the task's data is complete, with the checksums of the chunk files it wrote
    (`storage.integrity.checksums`); clears any earlier failure."""
    text = "done\n" if chunks is None else json.dumps({"chunks": chunks}, sort_keys=True) + "\n"
    _write_atomic(_path(store, scope, name, DONE), text)
    _path(store, scope, name, FAILED).unlink(missing_ok=True)


def mark_failed(store: Path, scope: str, name: str, error: str) -> None:
    """Record the error of a task that failed after its retries."""
    _write_atomic(_path(store, scope, name, FAILED), error.rstrip() + "\n")


def clear(store: Path, scope: str, name: str) -> None:
    """Forget a task's completion (its data is about to be rewritten)."""
    _path(store, scope, name, DONE).unlink(missing_ok=True)


def vouched_chunks(store: Path, scope: str, name: str) -> dict[str, list | None] | None:
    """The chunk checksums a done marker holds; None if there is no marker or it holds none
    (an unreadable marker vouches for nothing: {"(marker)": None} fails every check)."""
    try:
        text = _path(store, scope, name, DONE).read_text()
    except FileNotFoundError:
        return None
    if text.strip() == "done":
        return None
    try:
        return dict(json.loads(text)["chunks"])
    except (ValueError, KeyError, TypeError):
        return {str(_path(store, scope, name, DONE).relative_to(store)): [-1, "unreadable"]}


def is_done(store: Path, scope: str, name: str) -> bool:
    """Whether the task's done marker exists."""
    return _path(store, scope, name, DONE).exists()


@dataclass(frozen=True)
class MarkerState:
    """Status of one task: `done`, `failed` (with its error) or `pending`."""

    state: str
    error: str | None = None


def read_state(store: Path, scope: str, name: str) -> MarkerState:
    """The task's state as its markers say: done wins over failed, else pending."""
    if is_done(store, scope, name):
        return MarkerState("done")
    failed = _path(store, scope, name, FAILED)
    if failed.exists():
        return MarkerState("failed", failed.read_text().strip())
    return MarkerState("pending")
