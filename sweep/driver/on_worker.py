"""What a Dask worker runs for each task, and all it imports from the driver's side: the task's
body (`workers.tasks.run_task`, which imports its stage's module on first use) with numba on the
worker's threads. The graph sends this function by reference, so a worker imports this module,
never `sweep.driver.graph` (whose imports would bring torch to every CPU worker)."""

from __future__ import annotations

from distributed import get_worker

from workers.tasks import run_task
from workers.tasks.threads import numba_threads


def run_on_worker(task: object, *after: object) -> int:
    """Worker side: run the task with numba on the worker's threads (`after` are the results it
    waited for, unused)."""
    with numba_threads(get_worker().state.nthreads):
        return run_task(task)
