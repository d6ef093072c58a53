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
