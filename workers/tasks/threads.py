"""The cores a worker gives its tasks: numba's threads in a worker process, and the cores an
extraction task's pipeline may use (`task_cores`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

import numba

_WORKER_CORES: ContextVar[int | None] = ContextVar("worker_cores", default=None)


def settle_numba_pool() -> None:
    """Make NUMBA_NUM_THREADS agree with numba's pool: adopt a value set after numba's import
    while its threads have not started, else put back the size they started with (numba's next
    compilation raises once the two differ: a Nanny sets its worker's variables only after a
    spawned worker re-imported numba; seen on a 16-core machine with no numba cache)."""
    from numba.np.ufunc import parallel

    pool = str(numba.config.NUMBA_NUM_THREADS)
    if os.environ.get("NUMBA_NUM_THREADS", pool) == pool:
        return
    if parallel._is_initialized:  # numba's own test before it raises
        os.environ["NUMBA_NUM_THREADS"] = pool
    else:
        numba.config.reload_config()


@contextlib.contextmanager
def numba_threads(threads: int) -> Iterator[None]:
    """numba's parallel kernels on at most `threads` threads in this thread until the context
    exits (numba's count is per thread). A worker process calls its tasks in it with the cores
    it was given: the NUMBA_NUM_THREADS its Nanny sets comes too late where numba was imported
    before (a spawned worker re-imports the driver's main module, which may import numba)."""
    settle_numba_pool()
    saved = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(saved)


@contextlib.contextmanager
def worker_cores(cores: int) -> Iterator[None]:
    """Within the block, tasks run in this thread may use `cores` cores (`task_cores`): a Dask
    worker's threads, set by `workers.on_worker.run_on_worker`."""
    token = _WORKER_CORES.set(max(1, int(cores)))
    try:
        yield
    finally:
        _WORKER_CORES.reset(token)


def task_cores() -> int:
    """The cores the running task may use: its worker's (`worker_cores`: a Dask worker's
    threads), else every CPU this process may run on (a sweep run in process)."""
    cores = _WORKER_CORES.get()
    if cores is not None:
        return cores
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
