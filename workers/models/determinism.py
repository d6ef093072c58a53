"""Torch settings under which training and extraction give the same bits on any machine.

Float32 reductions split over torch's intra-op threads sum in an order that depends on the thread
count, so a model trained (or a forward pass run) with 1 and with 2 threads differs in the last
bits, and a verdict at the edge of the data's precision can flip. Inside `fixed_torch()` torch
runs on `threads` intra-op threads (training also with deterministic algorithms); the process's
own settings are restored when the last concurrent user leaves (the settings are process-wide,
so every thread of a worker that enters asks for the same count).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

TORCH_THREADS = 1  # the default for training and extraction (recorded in the store and records)

_LOCK = threading.Lock()
_users = 0
_held = 0  # the count the current users asked for
_saved: tuple[int, bool, bool] | None = None


@contextmanager
def fixed_torch(threads: int = TORCH_THREADS, *, deterministic: bool = False) -> Iterator[None]:
    """Within the block: `threads` intra-op threads, and with `deterministic` (training)
    deterministic algorithms too (a warning where an op has none). ValueError if another thread of
    this process holds a different count at the same time.

    torch keeps the count per OS thread (OpenMP) as well as process-wide, so every thread that
    enters sets it for itself; the process's settings come back when the last user leaves."""
    global _users, _held, _saved
    with _LOCK:
        if _users == 0:
            _saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
            _held = threads
        elif threads != _held:
            raise ValueError(f"torch threads: {threads} asked while this process runs with "
                             f"{_held}")
        if torch.get_num_threads() != threads:  # setting it also clears oneDNN's caches
            torch.set_num_threads(threads)  # this thread's count (and the process's default)
        if deterministic and not torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(True, warn_only=True)
        _users += 1
    try:
        yield
    finally:
        with _LOCK:
            _users -= 1
            if _users == 0 and _saved is not None:
                count, enabled, warn_only = _saved
                if torch.get_num_threads() != count:
                    torch.set_num_threads(count)
                torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
