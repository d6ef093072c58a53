"""An exclusive lock on a store, so two `sweep run`s never drive the same store at once.

In a local folder: `fcntl.flock` on `.sweep/lock` inside the store; the kernel releases it when
the holder exits, even on SIGKILL, so a killed driver never leaves a stale lock behind. On an
object store: a renewed lease (`storage.lease`) that a killed driver's successor takes over once
it expires. Either way, a store this lock's holder created and failed to finish (a full disk,
Ctrl-C while planning) is removed on exit: the place is as it was before the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from types import TracebackType

from storage.layout import BOOKKEEPING_DIR
from storage.lease import Lease, StoreBusyError
from storage.location import Location, StoreLike, locate
from storage.store import CREATING

__all__ = ["StoreBusyError", "StoreLock"]


class StoreLock:
    """Context manager holding the store's lock: a non-blocking `flock` locally, a lease on an
    object store (`break_lock`, `force`: see `storage.lease.Lease.acquire`)."""

    def __init__(self, store: StoreLike, *, break_lock: bool = False, force: bool = False) -> None:
        self.location: Location = locate(store)
        self.store = self.location.ref.url
        self.break_lock, self.force = break_lock, force
        self._fd: int | None = None
        self.lease: Lease | None = None

    def __enter__(self) -> StoreLock:
        self._created = not self._exists()
        if self.location.is_local:
            self._flock()
        else:
            self.lease = Lease(self.location)
            self.lease.acquire(break_lock=self.break_lock, force=self.force)
        if self._created:  # first: a store holding it was never finished (`storage.store`)
            self.location.write(CREATING, b"")
        return self

    def _exists(self) -> bool:
        path = self.location.local_path()
        if path is not None:
            return path.exists()
        self.location.probe()
        return self.location.any_key("")

    def _flock(self) -> None:
        path = self.location.local_path() / BOOKKEEPING_DIR / "lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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

    @property
    def lost(self) -> bool:
        """Whether another run broke this run's lease while it ran (object stores only)."""
        return self.lease is not None and self.lease.lost is not None

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
        elif self.lease is not None:
            self.lease.release()
            if self.lost:  # the store is another run's now: leave everything to it
                return
        else:
            return
        if self._created and exc_type is not None and not self._finished():
            self._remove_unfinished()  # created now, never finished
        elif self._created and self.location.read("zarr.json") is None:
            self._remove_empty_store()

    def _remove_unfinished(self) -> None:
        """Delete a store this run created and did not finish, its creation marker last, so
        that a cleanup cut short (a second Ctrl-C) still leaves a store a rerun recognises as
        unfinished (`storage.store.unfinished_creation`) and creates again."""
        keys = self.location.listing() if self.location.any_key("") else {}
        for top in sorted({key.split("/")[0] for key in keys} - {BOOKKEEPING_DIR}):
            if top in keys:  # an object at the top: the root metadata
                self.location.delete(top)
            else:
                self.location.delete_prefix(f"{top}/")
        self.location.delete_prefix("")

    def _finished(self) -> bool:
        """Whether the store's creation finished (the driver writes root `config` last)."""
        try:
            meta = json.loads(self.location.read("zarr.json") or b"{}")
            return "config" in meta.get("attributes", {})
        except (ValueError, AttributeError):
            return False

    def _remove_empty_store(self) -> None:
        """A run that failed before creating the store leaves nothing behind: locally only
        empty folders are removed (rmdir refuses anything else); remotely the lease alone."""
        path = self.location.local_path()
        self.location.delete(CREATING)
        if path is None:
            self.location.delete_prefix(f"{BOOKKEEPING_DIR}/lease/")
            return
        with contextlib.suppress(OSError):
            (path / BOOKKEEPING_DIR / "lock").unlink()
            (path / BOOKKEEPING_DIR).rmdir()
            path.rmdir()
