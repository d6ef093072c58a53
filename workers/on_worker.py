"""What a Dask worker runs for each task, and all it imports from the driver's side: the task's
body (`workers.tasks.run_task`, which imports its stage's module on first use) with numba on the
worker's threads. The graph sends this function by reference, so a worker imports this module,
never `sweep.driver.graph` (whose imports would bring torch to every CPU worker)."""

from __future__ import annotations

from distributed import get_worker

from workers.tasks import run_task
from workers.tasks.threads import numba_threads, worker_cores


def run_on_worker(task: object, *after: object) -> int:
    """Worker side: run the task with numba, and an extraction's pipeline, on the worker's
    threads (`after` are the results it waited for, unused)."""
    threads = get_worker().state.nthreads
    with numba_threads(threads), worker_cores(threads):
        return run_task(task)
