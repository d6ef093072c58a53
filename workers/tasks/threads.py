"""numba's threads in a worker process: its tasks run on the cores the worker was given."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numba


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
