"""How often a local cluster's close prints something beyond `sweep run`'s own dashboard line.

Each cycle starts a fresh Python process that opens the sweep's local cluster as `sweep run`
does (`sweep.clusters.client.open_client`, the `QuietTaskFailures` plugin `DaskExecutor` registers),
runs 20 short tasks and closes; a cycle is noisy when its stderr holds any other line (a heartbeat's
`CommClosedError` traceback, "Future exception was never retrieved", ...). Thread and process
workers alternate. Usage:

    PYTHONPATH=. python benchmarks/shutdown_noise.py --cycles 150
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CYCLE = """
import time
from distributed import as_completed
from sweep.clusters.client import open_client
from sweep.clusters.config import ClusterConfig
from sweep.terminal.quiet_logs import QuietTaskFailures

def busy(i):
    start = time.time()
    while time.time() - start < 0.05 * (i % 3):
        pass
    return i

if __name__ == "__main__":
    config = ClusterConfig.model_validate({"kind": "local", "local": {"processes": PROCESSES}})
    with open_client(config) as client:
        client.register_plugin(QuietTaskFailures())
        futures = [client.submit(busy, i, pure=False) for i in range(20)]
        for future in as_completed(futures):
            future.result()
        client.cancel(futures)
"""


def noisy(processes: bool) -> list[str]:
    """Run one cycle; the stderr lines other than the dashboard line."""
    code = CYCLE.replace("PROCESSES", str(processes))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    return [line for line in done.stderr.splitlines()
            if line.strip() and not line.startswith("sweep: local cluster, dashboard")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50, help="cycles per worker kind")
    args = parser.parse_args()
    counts = {"thread": 0, "process": 0}
    start = time.perf_counter()
    for i in range(args.cycles):
        for kind in counts:
            lines = noisy(kind == "process")
            if lines:
                counts[kind] += 1
                print(f"cycle {i} ({kind} workers): {lines[0][:120]}", file=sys.stderr)
    for kind, count in counts.items():
        print(f"{kind} workers: {count} of {args.cycles} cycles printed more than the "
              f"dashboard line")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
