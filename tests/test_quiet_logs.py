"""A successful run's terminal holds its own lines only: what Dask logs while the cluster closes
(a heartbeat's `CommClosedError` traceback, issue 22 item 8) is silenced in the driver and in
every worker process, and the driver's loggers get their levels back afterwards."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from tests.fault_helpers import REPO, env, write_text_sweep
from tests.noisy_close import run_tasks


@pytest.mark.parametrize("processes", [False, True], ids=["thread-workers", "process-workers"])
def test_what_a_closing_cluster_logs_never_reaches_the_terminal(tmp_path, processes):
    flag = tmp_path / "flag"
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "noisy_close.py"),
         "processes" if processes else "threads", str(flag)],
        capture_output=True, text=True, env=env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert flag.read_text().count("logged") == 2  # both workers logged the traceback ...
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sweep: local cluster, dashboard "), \
        done.stderr  # ... and none of it reached stderr


def test_the_drivers_loggers_speak_again_after_the_close(tmp_path, caplog):
    worker_logger = logging.getLogger("distributed.worker")
    before = worker_logger.level
    run_tasks(False, tmp_path / "flag")
    assert (tmp_path / "flag").read_text().count("logged") == 2
    assert not [r for r in caplog.records if "during heartbeat" in r.getMessage()]
    assert worker_logger.level == before
    worker_logger.error("a later run's error")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "a later run's error"]


def _worker_logging() -> tuple[bool, int]:
    """In a worker: whether "Compute Failed" is dropped, and distributed.worker's level."""
    from sweep.terminal.quiet_logs import DropComputeFailed

    logger = logging.getLogger("distributed.worker")
    return any(isinstance(f, DropComputeFailed) for f in logger.filters), logger.level


def test_a_shared_cluster_gets_its_workers_logging_back_after_the_sweep():
    """On an `address` cluster the sweep only uses, its plugin is removed at the end: the
    running workers log task failures again and are not silenced."""
    from distributed import Client, LocalCluster

    from sweep.terminal.quiet_logs import QuietTaskFailures

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        before = list(client.run(_worker_logging).values())[0]
        client.register_plugin(QuietTaskFailures())
        assert list(client.run(_worker_logging).values())[0][0] is True
        client.unregister_worker_plugin(QuietTaskFailures.name)
        assert list(client.run(_worker_logging).values())[0] == before == (False, before[1])
        assert before[1] <= logging.ERROR


LATE_NOISE = """
import asyncio, gc, sys
from contextlib import contextmanager
import sweep.clusters.client as client_module
real = client_module.open_client

@contextmanager
def late_noise(*args, **kwargs):
    with real(*args, **kwargs) as client:
        yield client
    loop = asyncio.new_event_loop()  # a future the close left failed and unretrieved ...
    future = loop.create_future()
    future.set_exception(TimeoutError("Timeout"))
    del future
    gc.collect()  # ... collected after the close: asyncio logs it then
    print("closed", file=sys.stderr)

client_module.open_client = late_noise  # `sweep run` imports it when it runs
sys.argv = ["sweep", "run", sys.argv[1], "--no-progress"]
from sweep.cli import run_command
run_command()
"""


def test_sweep_run_keeps_dask_quiet_after_its_cluster_closed(tmp_path):
    """asyncio logs a failed future nobody retrieved when it is collected, which can be after
    the close ("Future exception was never retrieved ... TimeoutError", 1 of 50 thread-worker
    closes in benchmarks/shutdown_noise.py): `sweep run`, which exits soon after, keeps the
    loggers silenced until it does."""
    path = write_text_sweep(tmp_path)
    done = subprocess.run([sys.executable, "-c", LATE_NOISE, str(path)], capture_output=True,
                          text=True, env=env(), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("sweep: local cluster, dashboard "), lines
    assert lines[1] == "closed"  # the late record was made, and not printed
