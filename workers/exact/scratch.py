"""Per-thread scratch arrays reused across the test stage's calls.

A fresh multi-MiB array costs page faults that rival the arithmetic done in it (restricting a
ViT-B input's 12 layers, or one rollout product, is about a millisecond) or the read into it (a
block of stored attention); the test stage asks for its buffers here instead. A buffer stays
valid until the same thread asks for the same name again, so a caller must be done with it
before its next call. Buffers above REUSE_MAX_BYTES
are not kept (at that size the O(n^3) work dwarfs the page faults, and memory matters more).
"""

from __future__ import annotations

import threading

import numpy as np

REUSE_MAX_BYTES = 64 << 20
_LOCAL = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
    """A C-contiguous array of `shape` and `dtype` (contents undefined), owned by this thread
    under `name`: the same memory each call, grown when a larger shape is asked for (a fresh
    array, not kept, above REUSE_MAX_BYTES)."""
    size = int(np.prod(shape))
    if np.dtype(dtype).itemsize * size > REUSE_MAX_BYTES:
        return np.empty(shape, dtype=dtype)
    pool: dict[tuple[str, np.dtype], np.ndarray] = _LOCAL.__dict__.setdefault("pool", {})
    key = (name, np.dtype(dtype))
    flat = pool.get(key)
    if flat is None or flat.size < size:
        flat = pool[key] = np.empty(size, dtype=dtype)
    return flat[:size].reshape(shape)
