"""A zarr store that remembers what it wrote: the size and CRC32C of every chunk a task writes.

A task's done marker vouches for its chunks with their checksums (`storage.integrity`). Taking
them from the bytes as zarr hands them to the store costs one CRC32C pass over data already in
memory, where reading every chunk back would cost a second transfer (a GET per chunk on an object
store). `written` maps each key to `[size, "crc32c:<hex>"]`, or None for a key zarr deleted (a
chunk equal to the fill value is not stored).
"""

from __future__ import annotations

from typing import Any

import google_crc32c
from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import WrapperStore

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
