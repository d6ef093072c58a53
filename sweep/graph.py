"""The sweep on Dask: one future per task, tagged with its pool, keyed by its task key.

Preparation and extraction take the `GPU` resource, tests and baseline chunks the `CPU` resource
(untagged tasks would land on GPU workers too). A task's future takes its dependencies' futures as
arguments (a test its shard's extraction, an extraction its model's preparation), so it runs
after them and never runs if one failed. Futures carry only the small frozen task specs; workers
load models once through `workers.tasks`' per-process cache.
"""

from __future__ import annotations

import logging
import sys

from distributed import Client, Future, WorkerPlugin, as_completed
from tqdm import tqdm

from sweep.interrupts import raise_if_interrupted
from sweep.plan import SweepPlan, Task
from sweep.runner import failure_text
from workers.tasks import run_task

QUIET_LOGGERS = ("distributed", "tornado", "asyncio")


def quiet_shutdown() -> None:
    """Silence distributed's loggers: after Ctrl-C, the cluster's closing logs cancelled tasks
    and broken heartbeats (with tracebacks) that are no fault; the summary line says it all."""
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in QUIET_LOGGERS]
    for name in [*QUIET_LOGGERS, *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


class DropComputeFailed(logging.Filter):
    """Drops distributed's "Compute Failed" record (the task, its exception and traceback): the
    driver writes them to the task's failed marker (`sweep status` shows them) and ends the run
    with one line, so they never reach the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Compute Failed")


def drop_compute_failed() -> None:
    """Install `DropComputeFailed` on the worker logger of this process, once."""
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, DropComputeFailed) for f in logger.filters):
        logger.addFilter(DropComputeFailed())


class QuietTaskFailures(WorkerPlugin):
    """Installs `DropComputeFailed` in every worker's process (local, SLURM, Kubernetes)."""

    name = "sweep-quiet-task-failures"

    def setup(self, worker: object) -> None:
        drop_compute_failed()


def _run(task: Task, *after: object) -> int:
    """Worker side: run the task (`after` are the results it waited for, unused)."""
    return run_task(task)


def submit_tasks(client: Client, plan: SweepPlan, tasks: list[Task],
                 retries: int) -> dict[str, Future]:
    """Submit every task in plan order; a task takes the futures of its dependencies that
    rerun (a test its extraction, an extraction its model's preparation) as arguments."""
    futures: dict[str, Future] = {}
    for task in tasks:
        after = tuple(futures[key] for key in plan.depends_on(task) if key in futures)
        futures[task.key] = client.submit(
            _run, task, *after, key=task.key, resources=task.resources, retries=retries,
            pure=False,
        )
    return futures


class DaskExecutor:
    """Runs tasks on a `distributed.Client` with a progress bar (`open_client` prints the
    dashboard address)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.errors: dict[str, BaseException] = {}  # key -> the exception of a failed task

    def execute(self, plan: SweepPlan, tasks: list[Task], retries: int,
                progress: bool) -> tuple[dict[str, str | None], list[str]]:
        drop_compute_failed()  # workers that are threads of this process
        self.client.register_plugin(QuietTaskFailures())
        futures = submit_tasks(self.client, plan, tasks, retries)
        try:
            return self._collect(plan, tasks, futures, progress)
        except KeyboardInterrupt:
            quiet_shutdown()
            raise

    def _collect(self, plan: SweepPlan, tasks: list[Task], futures: dict[str, Future],
                 progress: bool) -> tuple[dict[str, str | None], list[str]]:
        outcomes: dict[str, str | None] = {}
        errors: dict[str, BaseException] = {}
        with tqdm(total=len(futures), desc="sweep", unit="task", file=sys.stderr,
                  disable=not progress) as bar:
            for future in as_completed(futures.values()):
                raise_if_interrupted()  # a Ctrl-C that a compiler callback swallowed
                if future.status == "error":
                    error = future.exception()
                    errors[future.key] = error.with_traceback(future.traceback())
                else:
                    outcomes[future.key] = None
                bar.update()
        blocked = []
        for task in tasks:
            if task.key not in errors:
                continue
            if any(key in errors for key in plan.depends_on(task)):
                blocked.append(task.key)  # a dependency failed (or was blocked): it never ran
            else:
                outcomes[task.key] = failure_text(errors[task.key])
                self.errors[task.key] = errors[task.key]
        self.client.cancel(list(futures.values()))
        return outcomes, blocked
