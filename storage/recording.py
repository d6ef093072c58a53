"""A zarr store that remembers what it wrote: the size and CRC32C of every chunk a task writes.

A task's done marker vouches for its chunks with their checksums (`storage.integrity`). Taking
them from the bytes as zarr hands them to the store costs one CRC32C pass over data already in
memory, where reading every chunk back would cost a second transfer (a GET per chunk on an object
store). `written` maps each key to `[size, "crc32c:<hex>"]`, or None for a key zarr deleted (a
chunk equal to the fill value is not stored).

Over a local folder it also writes chunks itself (`file_writer`): what zarr's `LocalStore.set`
does (the key's folders made, the bytes written to a temporary file beside the key, renamed over
it) on the caller's thread, without zarr's event loop, its coroutine per chunk and its hand-off
to another thread; around the page cache where the file system takes it (`write_all`, below).
"""

from __future__ import annotations

import errno
import functools
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import WrapperStore

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


CRC32C = "crc32c:"


def crc32c_of(data: Any) -> str:
    """`crc32c:<8 hex>` of a bytes-like object (bytes, or a read-only numpy array)."""
    return f"{CRC32C}{google_crc32c.extend(0, data):08x}"


class RecordingStore(WrapperStore[Store]):
    """Delegates everything to the wrapped store; `written` records each key's `[size, crc]`
    as it is set (None once deleted). Shared by the copies zarr makes (`_with_store`).
    `location`: the `storage.location.Location` the wrapped store belongs to, for its owner."""

    def __init__(self, store: Store, location: Any = None) -> None:
        super().__init__(store)
        self.location = location
        self.written: dict[str, list | None] = {}

    def _with_store(self, store: Store) -> RecordingStore:
        copy = type(self)(store, self.location)
        copy.written = self.written
        return copy

    async def set(self, key: str, value: Buffer) -> None:
        data = value.as_numpy_array().view()
        data.setflags(write=False)  # google_crc32c takes read-only buffers without a copy
        record = [int(data.nbytes), crc32c_of(data)]
        await self._store.set(key, value)
        self.written[key] = record

    async def delete(self, key: str) -> None:
        await self._store.delete(key)
        self.written[key] = None

    def local_root(self) -> Path | None:
        """The folder of the wrapped store where it is a writable local folder, else None."""
        local = self._store
        if type(local) is not zarr.storage.LocalStore or local.read_only:
            return None
        return Path(local.root)

    def make_folders(self, keys: Iterable[str]) -> None:
        """The folders that will hold `keys`, made now in a writable local folder (a write makes
        any still missing); nothing for other stores (object stores have no folders)."""
        root = self.local_root()
        if root is None:
            return
        made: set[str] = set()
        for key in keys:  # each folder from the top down, tried once: one mkdir per new folder
            parts = key.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth])
                if folder not in made:
                    made.add(folder)
                    try:
                        os.mkdir(root / folder)
                    except FileExistsError:
                        pass
                    except FileNotFoundError:  # the store's own folder not made yet
                        (root / folder).mkdir(parents=True, exist_ok=True)

    def file_writer(self) -> Callable[[str, np.ndarray], None] | None:
        """`write(key, data)`: `key` set to the bytes of `data` (a C-contiguous uint8 array, not
        kept) as `set` sets it, recorded as `set` records it, on the caller's thread (several
        threads may call it at once); None unless the wrapped store is a writable local folder
        (object stores, memory and other wrappers go through zarr)."""
        root = self.local_root()
        if root is None:
            return None
        direct = takes_direct(str(root))

        def write(key: str, data: np.ndarray) -> None:
            data = data.view()
            data.flags.writeable = False  # google_crc32c takes read-only buffers without a copy
            record = [int(data.nbytes), crc32c_of(data)]
            put_file(root / key, data, direct)
            self.written[key] = record

        return write


def put_file(path: Path, data: np.ndarray, direct: bool = False) -> None:
    """`path` holds the bytes of `data` (C-contiguous) all at once: written to a temporary file
    in its folder (the folder made if missing), renamed over it; the temporary file removed if
    the write fails. Four system calls where the folder exists (open, write, close, rename): no
    `mkdir` tried first, no buffered file object (a two-thread write of 64 RoBERTa-sized chunks
    into made folders: 0.75-0.9x the wall of `open(...).write` after `mkdir`, 2026-12-07).
    `direct`: the bytes' whole pages around the page cache where they start on one
    (`write_all`)."""
    partial = f"{path}.{uuid.uuid4().hex}.partial"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) \
        | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(partial, flags, 0o666)
    except FileNotFoundError:  # a folder not made ahead (`RecordingStore.make_folders`)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(partial, flags, 0o666)
    try:
        try:
            write_all(fd, data, direct)
        finally:
            os.close(fd)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


# --- chunk files around the page cache (O_DIRECT) where a local file system takes it ----------
# A buffered write copies every byte into pages the kernel hands the file anew: for an extraction
# that writes 1.86 MB per ViT-B input, a copy and 455 fresh pages per input, all of it CPU on the
# writer's path. A direct write hands the device the caller's own pages (already in use, never
# copied): here 0.25-0.29 ms of CPU per ViT-B chunk against 0.44-2.9 ms buffered, at 0.7 ms of
# wall to this machine's disk (benchmarks/README.md, 2026-12-07, ninth session).
#
# Taken only where every condition holds, else the write is buffered as before, the same bytes:
# - the file system is one of `DIRECT_FILE_SYSTEMS` (local disks whose direct writes are the
#   same file as a buffered write; not NFS, Lustre, tmpfs, overlay or FUSE, where direct I/O is
#   absent, synchronous round trips, or passed through to another file system);
# - the data starts at an `ALIGN`-aligned address (the extraction's host buffers lay each input's
#   chunk out so: `workers.tasks.buffers`) and holds at least `ALIGN` bytes;
# - the kernel accepts `O_DIRECT` on the open file (`fcntl`), and the write itself.
# Only the data's whole `ALIGN` blocks go direct; the tail after them is written buffered.

ALIGN = 4096  # bytes: address, length and offset of a direct write (a page; >= any logical block)
DIRECT_FILE_SYSTEMS = frozenset({"ext4", "xfs"})
O_DIRECT = getattr(os, "O_DIRECT", 0) if fcntl else 0  # 0 where the platform has none (macOS)


def mount_file_system(path: Path, partitions: Iterable[Any] | None = None) -> str | None:
    """The type of the file system `path` lies on: that of the longest mount point above its
    real path among `partitions` (psutil's `disk_partitions(all=True)` by default: this
    machine's mounts, in mount order), None where none is listed."""
    if partitions is None:
        import psutil

        try:
            partitions = psutil.disk_partitions(all=True)
        except OSError:
            return None
    target = os.path.realpath(path)
    best, kind = -1, None
    for partition in partitions:
        point = partition.mountpoint
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # a later mount over the same point hides the earlier
            best, kind = len(point), partition.fstype
    return kind


@functools.lru_cache(maxsize=64)
def takes_direct(root: str) -> bool:
    """Whether chunk files under the folder `root` may be written direct: the platform has
    `O_DIRECT` and `root` lies on one of `DIRECT_FILE_SYSTEMS`."""
    return bool(O_DIRECT) and mount_file_system(Path(root)) in DIRECT_FILE_SYSTEMS


def write_all(fd: int, data: np.ndarray, direct: bool) -> None:
    """The bytes of `data` (C-contiguous) written to `fd` from its position: their whole
    `ALIGN` blocks direct where `direct` and `data` starts aligned (`O_DIRECT` set on `fd` for
    them, cleared after), the rest buffered; a direct write the kernel refuses (EINVAL) goes on
    buffered, from where it stopped."""
    view = memoryview(data).cast("B")
    head = len(view) // ALIGN * ALIGN
    if direct and O_DIRECT and head and data.ctypes.data % ALIGN == 0:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | O_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
        else:
            try:
                while head:
                    done = os.write(fd, view[:head])
                    view, head = view[done:], head - done
                    if done % ALIGN:  # a short write off a block: the rest buffered
                        break
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
            finally:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    while view:
        view = view[os.write(fd, view):]
