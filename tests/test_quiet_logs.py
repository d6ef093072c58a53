"""A successful run's terminal holds its own lines only: what Dask logs while the cluster closes
(a heartbeat's `CommClosedError` traceback, issue 22 item 8) is silenced in the driver and in
every worker process, and the driver's loggers get their levels back afterwards."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from tests.fault_helpers import REPO, env
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
    from sweep.quiet_logs import DropComputeFailed

    logger = logging.getLogger("distributed.worker")
    return any(isinstance(f, DropComputeFailed) for f in logger.filters), logger.level


def test_a_shared_cluster_gets_its_workers_logging_back_after_the_sweep():
    """On an `address` cluster the sweep only uses, its plugin is removed at the end: the
    running workers log task failures again and are not silenced."""
    from distributed import Client, LocalCluster

    from sweep.quiet_logs import QuietTaskFailures

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        before = list(client.run(_worker_logging).values())[0]
        client.register_plugin(QuietTaskFailures())
        assert list(client.run(_worker_logging).values())[0][0] is True
        client.unregister_worker_plugin(QuietTaskFailures.name)
        assert list(client.run(_worker_logging).values())[0] == before == (False, before[1])
        assert before[1] <= logging.ERROR
