"""An exclusive lock on a store, so two `sweep run`s never drive the same store at once.

`fcntl.flock` on a file inside the store: the kernel releases it when the holder exits, even on
SIGKILL, so a killed driver never leaves a stale lock behind. A store this lock's holder created
and failed to finish (a full disk, Ctrl-C while planning) is removed on exit: the folder is as
it was before the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path
from types import TracebackType

from storage.errors import InputError
from storage.layout import BOOKKEEPING_DIR


class StoreBusyError(InputError):
    """Another process holds the store's lock."""


class StoreLock:
    """Context manager holding an exclusive, non-blocking `flock` on the store's lock file."""

    def __init__(self, store: str | Path) -> None:
        self.store = Path(store)
        self.path = self.store / BOOKKEEPING_DIR / "lock"
        self._fd: int | None = None

    def __enter__(self) -> StoreLock:
        self._created = not self.store.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreBusyError(
                f"store {self.store} is in use by another sweep run (pid {holder}); "
                f"wait for it to finish or stop it, then rerun"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            if self._created and exc_type is not None and not self._finished():
                shutil.rmtree(self.store, ignore_errors=True)  # created now, never finished
            elif self._created and not (self.store / "zarr.json").exists():
                self._remove_empty_store()

    def _finished(self) -> bool:
        """Whether the store's creation finished (the driver writes root `config` last)."""
        try:
            meta = json.loads((self.store / "zarr.json").read_text())
            return "config" in meta.get("attributes", {})
        except (OSError, ValueError, AttributeError):
            return False

    def _remove_empty_store(self) -> None:
        """A run that failed before creating the store leaves no folder behind (only empty
        folders are removed: rmdir refuses anything else)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
            self.path.parent.rmdir()
            self.store.rmdir()
