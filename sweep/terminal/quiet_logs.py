"""What of Dask's logging reaches the terminal: a task's failure and a cluster's closing never do.

A failed task's "Compute Failed" dump goes to its failed marker (`sweep status` shows it) and the
run ends with one line; a closing cluster's chatter (cancelled tasks, a heartbeat that met a
closed comm, with its `CommClosedError` traceback) comes after every result is recorded and is
no fault. Both are silenced where they are logged: in this process and in every worker process.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import WorkerPlugin
from distributed.core import Status

QUIET_LOGGERS = ("distributed", "tornado", "asyncio")
CLOSING = (Status.closing, Status.closing_gracefully, Status.closed)


def _quiet_names() -> list[str]:
    """The loggers `quiet_shutdown` silences: the roots and every child created so far."""
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in QUIET_LOGGERS]
    return [*QUIET_LOGGERS, *names]


def quiet_shutdown() -> None:
    """Silence distributed's, tornado's and asyncio's loggers in this process."""
    for name in _quiet_names():
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


@contextmanager
def restored_log_levels() -> Iterator[None]:
    """On exit, give the loggers `quiet_shutdown` silences back the levels they had on entry
    (a driver that runs several sweeps, like a test session, sees each one's logs), after a
    garbage collection: a future the close left unretrieved ("Future exception was never
    retrieved ... TimeoutError") is logged by asyncio when it is collected, not when it fails."""
    levels = {name: logging.getLogger(name).level for name in _quiet_names()}
    try:
        yield
    finally:
        gc.collect()
        for name in _quiet_names():
            logging.getLogger(name).setLevel(levels.get(name, logging.NOTSET))


class DropComputeFailed(logging.Filter):
    """Drops distributed's "Compute Failed" record (the task, its exception and traceback) and
    its note that a task the driver cancelled (Ctrl-C, a closing run) "ended with
    CancelledError": neither is a fault of the worker's."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not (message.startswith("Compute Failed")
                    or message.endswith("ended with CancelledError"))


WORKER_LOGGERS = ("distributed.worker", "distributed.worker.state_machine")
"""Where those records are logged (a filter applies to its own logger's records only)."""


def drop_compute_failed() -> None:
    """Install `DropComputeFailed` on the worker loggers of this process, once."""
    for name in WORKER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropComputeFailed) for f in logger.filters):
            logger.addFilter(DropComputeFailed())


def keep_compute_failed() -> None:
    """Take `DropComputeFailed` off the worker loggers of this process again."""
    for name in WORKER_LOGGERS:
        logger = logging.getLogger(name)
        for found in [f for f in logger.filters if isinstance(f, DropComputeFailed)]:
            logger.removeFilter(found)


class QuietTaskFailures(WorkerPlugin):
    """In every worker's process (local, SLURM, Kubernetes): `DropComputeFailed` from the start,
    and, once the worker begins to close, `quiet_shutdown`. A worker that is a thread of the
    driver leaves the driver's loggers alone (the driver silences its own close). Removed from
    a running worker (a shared cluster the sweep only used), it undoes `DropComputeFailed`."""

    name = "sweep-quiet-task-failures"

    def __init__(self) -> None:
        self.driver_pid = os.getpid()

    def setup(self, worker: object) -> None:
        drop_compute_failed()

    def teardown(self, worker: object) -> None:
        if os.getpid() == self.driver_pid:
            return
        if getattr(worker, "status", None) in CLOSING:
            quiet_shutdown()
        else:
            keep_compute_failed()
