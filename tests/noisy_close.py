"""A worker plugin that logs, while its worker closes, what a heartbeat meeting a closed comm
logs (distributed.worker, ERROR, a `CommClosedError` traceback), and leaves a flag file saying
it did; and a script that runs a few tasks on the sweep's local cluster with it registered."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from distributed import WorkerPlugin
from distributed.comm.core import CommClosedError


class NoisyClose(WorkerPlugin):
    name = "test-noisy-close"

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def teardown(self, worker: object) -> None:
        try:
            raise CommClosedError("in <TCP (closed) ConnectionPool.heartbeat_worker>: Stream is "
                                  "closed")
        except CommClosedError:
            logging.getLogger("distributed.worker").exception(
                "Failed to communicate with scheduler during heartbeat.")
        with open(self.flag, "a") as handle:
            handle.write("logged\n")


def run_tasks(processes: bool, flag: Path) -> None:
    """A local cluster as `sweep run` opens it, the plugins `DaskExecutor` registers, a noisy
    one after them, ten tasks, then the close."""
    from sweep.clusters.client import open_client
    from sweep.clusters.config import ClusterConfig
    from sweep.terminal.quiet_logs import QuietTaskFailures

    config = ClusterConfig.model_validate({"kind": "local", "local": {"processes": processes}})
    with open_client(config) as client:
        client.register_plugin(QuietTaskFailures())
        client.register_plugin(NoisyClose(str(flag)))
        assert sum(client.gather(client.map(abs, range(-5, 5)))) == 25


if __name__ == "__main__":
    run_tasks(sys.argv[1] == "processes", Path(sys.argv[2]))
