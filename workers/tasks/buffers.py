"""The host buffers an extraction task writes the store from: laid out as the store's attention
chunks (input, layer, head, t_max, t_max), float32, zeroed once and reused batch after batch.
Each input's chunk starts on a page (`storage.recording.ALIGN`; its row padded up to whole
pages), so that its file is written from it around the page cache where the file system takes
it (`storage.recording.write_all`).

On a CUDA device the model's maps land in one buffer on the device (`ChunkSink`), which one
`non_blocking` copy per batch moves into a pinned host buffer; on the CPU the maps land in the
host buffer itself. Batch k uses host buffer k % count: with two, the writer stores batch k-1
from one while batch k fills the other (`workers.tasks.pipeline` waits for batch k-1's write
before batch k+1 reuses its buffer).

Beside them lie the model inputs of the last batch of each parity, which the next batch of that
parity is prepared into (`ChunkBuffers.inputs`).

A process keeps the last set it used (`chunk_buffers`) for its next task of the same shapes:
no zeroed pages to fault in, no pinned memory to allocate again, per task. A task that fails
drops its set (a batch cut short leaves values its rows' extents do not record).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from storage.recording import ALIGN
from workers.models.extraction import ChunkSink


@dataclass
class Filled:
    """A host buffer holding a batch: rows [:n] are its inputs' chunks once `ready()` returns."""

    array: np.ndarray  # (rows, layer, head, t_max, t_max) float32, the whole buffer
    n: int
    event: torch.cuda.Event | None = None  # recorded after the device-to-host copy

    def ready(self) -> np.ndarray:
        """Rows [:n], once the copy into them has finished."""
        if self.event is not None:
            self.event.synchronize()
        return self.array[:self.n]


class ChunkBuffers:
    """`count` host buffers of `rows` inputs (pinned on CUDA) and the sinks a forward pass writes
    into: one per host buffer on the CPU, one device buffer on CUDA (copied out per batch)."""

    def __init__(self, model: str, shape: tuple[int, int, int, int], rows: int, each: bool,
                 device: torch.device, count: int) -> None:
        cuda = device.type == "cuda"
        # (input, layer, head, t_max, t_max) views of flat buffers, each input on its own pages
        self._flat_host = [_aligned_zeros(rows, shape, pinned=cuda) for _ in range(count)]
        self.host = [_rows(flat, rows, shape) for flat in self._flat_host]
        self._flat_device = torch.zeros(rows * _row_floats(shape), dtype=torch.float32,
                                        device=device) if cuda else None
        self.on_device = None if self._flat_device is None else \
            _rows(self._flat_device, rows, shape)
        # the sink's `extents` say what each row holds: one sink per buffer written into
        targets = [self.on_device] if cuda else self.host
        self.sinks = [ChunkSink(model, shape[0], each, target) for target in targets]
        # per batch parity: the model inputs a batch was prepared into, which batch k+2's
        # parts are prepared into in turn (`Extractor.prepare_into`, where they fit)
        self.inputs: dict[int, dict[str, torch.Tensor]] = {}

    def sink(self, k: int) -> ChunkSink:
        """The sink batch k's forward pass writes into."""
        return self.sinks[k % len(self.sinks)]

    def filled(self, k: int, n: int) -> Filled:
        """Batch k's host buffer with its n rows (on CUDA after one non_blocking copy from the
        device buffer, queued behind the forward pass; `Filled.ready` waits for it)."""
        host = self.host[k % len(self.host)]
        if self.on_device is None:
            return Filled(host.numpy(), n)
        span = n * _row_floats(tuple(host.shape[1:]))  # rows [:n] and their padding: contiguous
        self._flat_host[k % len(self.host)][:span].copy_(self._flat_device[:span],
                                                          non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.on_device.device))  # the copy's stream
        return Filled(host.numpy(), n, event)


_KEPT: dict[tuple, ChunkBuffers] = {}  # the last set a task of this process used, by shapes
_KEPT_LOCK = threading.Lock()


@contextmanager
def chunk_buffers(model: str, shape: tuple[int, int, int, int], rows: int, each: bool,
                  device: torch.device, count: int) -> Iterator[ChunkBuffers]:
    """`ChunkBuffers` for one task: the set the process kept from its last task when the
    shapes are the same (each task has it alone), else a new one; kept again (the only one)
    when the task succeeds."""
    key = (shape, rows, each, str(device), count)
    with _KEPT_LOCK:
        buffers = _KEPT.pop(key, None)
    if buffers is None:
        buffers = ChunkBuffers(model, shape, rows, each, device, count)
    for sink in buffers.sinks:
        sink.model = model  # the name its errors give
    yield buffers
    with _KEPT_LOCK:  # not reached when the task raised: its set is dropped
        _KEPT.clear()
        _KEPT[key] = buffers


def _row_floats(shape: tuple[int, ...]) -> int:
    """Floats from one input's chunk of `shape` to the next: the chunk, padded to whole pages."""
    page = ALIGN // 4
    return -(-math.prod(shape) // page) * page


def _rows(flat: torch.Tensor, rows: int, shape: tuple[int, ...]) -> torch.Tensor:
    """`flat` (at least `rows` padded rows, `_row_floats`) as (rows, *shape): a view, each row
    C-contiguous at the start of its padded span."""
    return flat[:rows * _row_floats(shape)].view(rows, -1)[:, :math.prod(shape)].view(
        rows, *shape)


def _aligned_zeros(rows: int, shape: tuple[int, ...], pinned: bool) -> torch.Tensor:
    """`rows` padded rows of zeroed float32 (flat) starting on a page, in page-locked memory
    when `pinned` and the driver gives it (a pageable one otherwise: the copies are then
    synchronous, the values the same)."""
    size = rows * _row_floats(shape) + ALIGN // 4  # a page to spare: the start moved onto one
    flat = None
    if pinned:
        try:
            flat = torch.zeros(size, dtype=torch.float32, pin_memory=True)
        except RuntimeError:
            pass
    if flat is None:
        flat = torch.from_numpy(np.zeros(size, dtype=np.float32))
    start = (-flat.data_ptr() % ALIGN) // 4
    return flat[start:start + rows * _row_floats(shape)]
