"""Batches through three stages, one batch each in flight: while the caller's thread runs batch
k (the forward pass), batch k+1 is loaded (its parts on the cores the forward pass leaves: one
fewer than the worker's) and batch k-1 written. Each stage meets the batches in order, so what
they compute is what one thread computes; with one core the stages run one after another on the
caller's thread. An optional fourth stage, `ahead`, readies batch k's write (an extraction makes
its chunk folders) on the loader's thread while batch k-1 runs (batch 0's while batch 0 runs,
after batch 1's load): off the writer's path, and never ahead of a load the forward pass waits
for. An optional `tail` runs once on the caller's thread while the last batch is written (an
extraction writes its token counts and kinds there).

A stage's error reaches the caller, the one an in-order run meets first (an earlier batch's
write before a later batch's load), after every stage thread has stopped: nothing keeps writing
once the call returns or raises. Ctrl-C (KeyboardInterrupt in the caller's thread) sets `stop`,
which the writer checks between chunks, and is raised once the threads are done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

A = TypeVar("A")
B = TypeVar("B")
Mapper = Callable[[Callable[[A], B], Sequence[A]], list[B]]


def _nothing(k: int) -> None:
    """No stage."""


def serial_map(fn: Callable[[A], B], items: Sequence[A]) -> list[B]:
    """`fn` over `items` on this thread, in order."""
    return [fn(item) for item in items]


def run_batches(n: int, load: Callable[[int, Mapper], Any], run: Callable[[int, Any], Any],
                write: Callable[[int, Any, Mapper], None], cores: int,
                stop: threading.Event | None = None,
                ahead: Callable[[int], None] | None = None,
                tail: Callable[[], None] | None = None) -> None:
    """For k in 0..n-1: `write(k, run(k, load(k, parts)), parts)`, pipelined on `cores` > 1
    (`parts` maps a function over a batch's parts: on a pool of `cores` threads for the first
    load and the last write, which run alone; of `cores` - 1 for every other load, beside a
    forward pass, which keeps a core to itself (serially with two cores); serially for every
    other write, and with one core). `run` always runs on the calling thread;
    `write(k)` starts after `run(k)` and before `run(k + 2)` starts (two buffers suffice);
    `load(k + 1)` while `run(k)` runs. `ahead(k)`, where given: after `load(k)` (and `load(1)`
    for k = 0) and before `write(k)`, on the loader's thread (with one core, after `run(k)`);
    its error reaches the caller after `run(k)`'s and `write(k - 1)`'s. `tail()`, where given,
    once after the last `run` (and `write(n - 2)`), on the calling thread while the last write
    runs (with one core, after it); the last write's error reaches the caller before its own."""
    stop = stop or threading.Event()
    ahead = ahead or _nothing
    if cores <= 1:
        for k in range(n):
            result = run(k, load(k, serial_map))
            ahead(k)
            write(k, result, serial_map)
        if tail is not None:
            tail()
        return
    part_pools = [ThreadPoolExecutor(count, thread_name_prefix="extract-part")
                  for count in ((cores, cores - 1) if cores > 2 else (cores,))]
    on_pool = _mapper(part_pools[0])
    beside = _mapper(part_pools[1]) if cores > 2 else serial_map  # a load beside a forward pass
    loader = ThreadPoolExecutor(1, thread_name_prefix="extract-load")
    writer = ThreadPoolExecutor(1, thread_name_prefix="extract-write")

    written: Future | None = None  # batch k-1's write
    try:
        loading = loader.submit(load, 0, on_pool) if n else None
        readying: dict[int, Future] = {}
        for k in range(n):
            item = loading.result()
            if k + 1 < n:
                loading = loader.submit(load, k + 1, beside)
            for j in range(k, min(k + 2, n)):  # batch 0's beside run(0) too, after load(1)
                if j not in readying:
                    readying[j] = loader.submit(ahead, j)
            result = run(k, item)
            if written is not None:
                written.result()
            readying.pop(k).result()
            # the last write has the cores to itself: every load is done
            written = writer.submit(write, k, result, on_pool if k == n - 1 else serial_map)
        if tail is not None:
            tail()
        if written is not None:
            written.result()
    except KeyboardInterrupt:
        stop.set()  # the writer stops between chunks
        raise
    except BaseException:
        # batch k failed to load or run: batch k-1's write, before it in batch order, may have
        # failed too, and its error is the one an in-order run meets first
        if written is not None and written.exception() is not None:
            raise written.exception() from None
        raise
    finally:
        stop.set()
        for pool in part_pools:
            pool.shutdown(wait=False, cancel_futures=True)  # parts not started never start
        for pool in (loader, *part_pools, writer):
            pool.shutdown(wait=True)


def _mapper(pool: ThreadPoolExecutor) -> Mapper:
    """A `Mapper` over `pool`'s threads."""
    def on_pool(fn: Callable[[A], B], items: Sequence[A]) -> list[B]:
        futures = [pool.submit(fn, item) for item in items]
        return [future.result() for future in futures]

    return on_pool
