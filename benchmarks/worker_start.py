"""Start-up time and resident set of a CPU test worker process, this tree against older ones
(worktrees of earlier commits), in one run, the trees in turn round after round.

    git worktree add --detach /tmp/lean-before d2a9e84   # the commit before the split
    PYTHONPATH=. python benchmarks/worker_start.py /tmp/lean-before [--rounds 3]

Per round and tree: a fresh `dask worker ADDRESS --nthreads 1 --resources CPU=1` (the tree alone
on PYTHONPATH, its folder the working directory, thread variables 1), as cluster.yaml tells a user
to start one, joins a scheduler process; the driver (this process, this tree's task specs) sends
it two test tasks one after the other, as its tree's sweep sends them (that tree's worker
function, named by its path: `workers.on_worker.run_on_worker`, or before it existed
`sweep.driver.graph._run`), over one shard of `benchmarks/stage_vs_tree.py`'s attention-like
data (T = `--t`, 12 layers, 8 inputs). Printed per tree, medians over the rounds after a
warm-up round (numba's cache): seconds from the worker's start until the scheduler knows it, until
its first task's result (the task modules' imports included; and the CPU-seconds the worker
process spent until then, which a loaded machine changes less), and the second task alone; the
worker process's RSS once it joined, after its first task and after its second; whether torch
was in its `sys.modules`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client
from pool_bench import REPO, start_scheduler, thread_env, write_store


def call(path: str, *args: object) -> object:
    """On the worker: the function at dotted `path` (its tree's, which the driver's and the
    scheduler's tree may not have), called with `args`. Sent by value, so only the worker
    imports the path."""
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(*args)


def worker_function(tree: Path) -> str:
    """What `tree`'s sweep sends a worker for each task."""
    if (tree / "workers" / "on_worker.py").exists():
        return "workers.on_worker.run_on_worker"
    if (tree / "sweep" / "driver" / "on_worker.py").exists():  # before it moved to workers
        return "sweep.driver.on_worker.run_on_worker"
    return "sweep.driver.graph._run"


def worker_state() -> tuple[float, bool, float]:
    """On the worker: its RSS in MiB, whether it imported torch, its CPU-seconds so far."""
    import psutil

    process = psutil.Process()
    cpu = process.cpu_times()
    return process.memory_info().rss / 2**20, "torch" in sys.modules, cpu.user + cpu.system


def one_worker(client: Client, address: str, tree: Path, task: object, tag: str,
               folder: Path) -> dict[str, float]:
    """Start a worker of `tree`, time it to the scheduler and through two test tasks."""
    start = time.perf_counter()
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--resources", "CPU=1", "--no-dashboard", "--name", tag, "--local-directory",
         str(folder)],
        cwd=tree, env=thread_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client.wait_for_workers(1, timeout=300)
        joined = time.perf_counter() - start
        (rss_joined, _, _), = client.run(worker_state).values()
        function = worker_function(tree)
        client.submit(call, function, task, key=f"{tag}-1", pure=False).result()
        first = time.perf_counter() - start
        (rss_first, torch, cpu_first), = client.run(worker_state).values()
        again = time.perf_counter()
        client.submit(call, function, task, key=f"{tag}-2", pure=False).result()
        second = time.perf_counter() - again
        (rss_second, _, _), = client.run(worker_state).values()
    finally:
        worker.terminate()
        worker.wait(60)
        deadline = time.monotonic() + 60
        while client.scheduler_info()["workers"] and time.monotonic() < deadline:
            time.sleep(0.1)
    return {"joined s": joined, "first task s": first, "second task s": second,
            "first task cpu": cpu_first,
            "RSS joined": rss_joined, "RSS first": rss_first, "RSS second": rss_second,
            "torch": float(torch)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path, help="worktrees of older commits")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds after a warm-up")
    parser.add_argument("--t", type=int, default=197, help="tokens per input")
    args = parser.parse_args()
    trees = [REPO, *(tree.resolve() for tree in args.trees)]
    rows: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    loads = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (task,) = write_store(folder / "start.zarr", args.t, 8, 8)
        scheduler, address = start_scheduler(folder, "scheduler.json")
        try:
            with Client(address, timeout="60s") as client:
                for rnd in range(args.rounds + 1):
                    for tree in trees if rnd % 2 == 0 else trees[::-1]:
                        loads.append(os.getloadavg()[0])
                        row = one_worker(client, address, tree, task, f"w{rnd}-{len(loads)}",
                                         folder)
                        if rnd:
                            rows[tree].append(row)
        finally:
            scheduler.terminate()
            scheduler.wait(30)
    print(f"a CPU test worker (dask worker --nthreads 1), one shard at T = {args.t} (8 inputs, "
          f"12 layers) per task; medians of {args.rounds} rounds after a warm-up; "
          f"{os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f}")
    for tree, measured in rows.items():
        med = {key: statistics.median(r[key] for r in measured) for key in measured[0]}
        print(f"  {tree}: joined {med['joined s']:.2f} s, first task done {med['first task s']:.2f}"
              f" s ({med['first task cpu']:.2f} CPU-s in the worker process), second task "
              f"{med['second task s']:.2f} s; RSS {med['RSS joined']:.0f} MiB "
              f"joined, {med['RSS first']:.0f} after the first task, {med['RSS second']:.0f} after "
              f"the second; torch imported: {bool(med['torch'])}")
        print("    per round: " + "; ".join(
            f"{r['first task s']:.2f} s, {r['RSS second']:.0f} MiB" for r in measured))


if __name__ == "__main__":
    main()
