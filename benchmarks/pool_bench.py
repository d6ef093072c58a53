"""Test-stage throughput of a CPU pool of C = 1 and C = 2 (or `--cores`) cores, in one run: C
threads of one worker process (the SLURM and Kubernetes CPU pools before issue 32: one worker of
`cores` threads, thread variables = cores) against C single-threaded worker processes (the pools as
shipped: `sweep.clusters.shapes`), and each worker process's memory after its tasks.

    PYTHONPATH=. python benchmarks/pool_bench.py [--t 197] [--shards 8] [--rounds 3] [--cores 2]
    PYTHONPATH=. python benchmarks/pool_bench.py --memory 197,577,1370

`--memory`: instead, for each T, the peak resident set of a fresh single-threaded process that
imports what a test task imports and then runs one test task (one shard of `shard(T)`).

A store in a temporary folder holds `--shards` shards of the attention-like inputs of
`benchmarks/stage_vs_tree.py` (`shard(t)`: 12 layers, 8 inputs at T <= 257); every pool is a real
`distributed` SpecCluster of Nanny workers built by `sweep.clusters.local.worker_specs` (the thread
variables set to each worker's threads). All pools start first; then, round by round and pool after
pool, each runs every shard's test task as a sweep submits it
(`sweep.driver.on_worker.run_on_worker`: read, restriction, check, radius, rollout, results,
marker). The first round warms up (numba's cache, scratch buffers) and is not counted; reported:
inputs per second (best round), the ratio to C = 1, and the largest resident set (RSS) of a worker
process once it imported what a test task imports, and after its last task.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client, Scheduler, SpecCluster
from stage_vs_tree import TOKEN_SETS, shard

from storage.location import StoreRef
from storage.store import create_root, ensure_model, open_model, write_attention, write_tokens
from sweep.clusters.config import THREAD_VARIABLES, LocalPool
from sweep.clusters.local import worker_specs
from workers.task_specs import TestTask


def pools(cores: list[int]) -> dict[str, tuple[int, int]]:
    """name: (worker processes, threads per process): C = 1, then for each C > 1 the pool before
    issue 32 (one process of C threads) and the shipped one (C single-threaded processes)."""
    shapes = {"C=1 (1 process x 1 thread)": (1, 1)}
    for c in (c for c in cores if c > 1):
        shapes[f"C={c}, before (1 process x {c} threads)"] = (1, c)
        shapes[f"C={c}, shipped ({c} processes x 1 thread)"] = (c, 1)
    return shapes


def write_store(folder: Path, t: int, shards: int) -> list[TestTask]:
    """A store of `shards` copies of `shard(t)` as model `m`; one TestTask per shard."""
    attention, n_tokens, kinds = shard(t)
    per = attention.shape[0]
    store = StoreRef.of(str(folder / "bench.zarr"))
    root = create_root(store)
    ensure_model(root, "m", input_ids=[f"i{i}" for i in range(per * shards)],
                 n_layers=attention.shape[1], t_max=t, shard_size=per, token_sets=TOKEN_SETS,
                 attrs={}, fingerprint_inputs={})
    root.attrs["models"] = ["m"]
    group = open_model(store, "m", mode="r+")
    tasks = []
    for s in range(shards):
        write_attention(group, s * per, attention)
        write_tokens(group, s * per, n_tokens, kinds)
        tasks.append(TestTask(key=f"test-m-{s:05d}", store=store, model="m", shard=s,
                              start=s * per, stop=(s + 1) * per, token_sets=TOKEN_SETS,
                              tol=1e-12))
    return tasks


def start_pool(processes: int, threads: int) -> SpecCluster:
    pool = LocalPool(workers=processes, threads=threads, resources={"CPU": float(threads)})
    return SpecCluster(
        workers=worker_specs({"cpu": pool}, "auto", processes=True),
        scheduler={"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}},
        silence_logs=logging.WARNING,
    )


def rss_bytes(imported: bool = False) -> int:
    """This process's resident set, from /proc (Linux); `imported`: after importing what a
    test task imports (`workers.tasks.verdicts`: numpy, numba, zarr)."""
    if imported:
        import workers.tasks.verdicts  # noqa: F401
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


PROBE = """
import pickle, resource, sys
import workers.tasks.verdicts
task = pickle.loads(sys.stdin.buffer.read())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
workers.tasks.verdicts.run_test(task)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss(t: int) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh one-thread process after its imports and after one test task
    over one shard of `shard(t)` (written here, so its making does not count)."""
    env = {**os.environ, **{name: "1" for name in THREAD_VARIABLES}}
    with tempfile.TemporaryDirectory() as folder:
        (task,) = write_store(Path(folder), t, 1)
        done = subprocess.run([sys.executable, "-c", PROBE], input=pickle.dumps(task), env=env,
                              capture_output=True, check=True)
    before, after = (int(v) / 1024 for v in done.stdout.split())
    return before, after


def main() -> None:
    """Parse the options, run the pools, print one line per pool."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--t", type=int, default=197, help="tokens per input")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    parser.add_argument("--cores", default="2", help="C values beside 1, e.g. 2,8,16")
    parser.add_argument("--memory", default=None, help="T values, e.g. 197,577,1370: peak RSS")
    args = parser.parse_args()
    if args.memory:
        for t in (int(v) for v in args.memory.split(",")):
            before, after = peak_rss(t)
            print(f"T = {t}: peak RSS {before:.0f} MiB after the imports, {after:.0f} MiB after "
                  f"one test task ({len(shard(t)[1])} inputs, 12 layers, both token sets)")
        return
    from sweep.driver.on_worker import run_on_worker  # what a sweep submits: run_task, numba
    # on the worker's threads

    shapes = pools([int(c) for c in args.cores.split(",")])
    with tempfile.TemporaryDirectory() as folder:
        tasks = write_store(Path(folder), args.t, args.shards)
        inputs = sum(task.stop - task.start for task in tasks)
        clusters = {name: start_pool(*shape) for name, shape in shapes.items()}
        clients = {name: Client(cluster) for name, cluster in clusters.items()}
        best = dict.fromkeys(shapes, 0.0)
        idle = {name: max(client.run(rss_bytes, True).values())
                for name, client in clients.items()}
        try:
            for rnd in range(args.rounds + 1):
                for name, client in clients.items():
                    start = time.perf_counter()
                    futures = [client.submit(run_on_worker, task, key=f"{task.key}-{rnd}",
                                             resources={"CPU": 1}) for task in tasks]
                    client.gather(futures)
                    rate = inputs / (time.perf_counter() - start)
                    if rnd:
                        best[name] = max(best[name], rate)
            rss = {name: max(client.run(rss_bytes).values()) for name, client in clients.items()}
        finally:
            for client in clients.values():
                client.close()
            for cluster in clusters.values():
                cluster.close()
    load = os.getloadavg()[0]
    print(f"T = {args.t}, 12 layers, {inputs} inputs per round, best of {args.rounds} rounds; "
          f"{os.cpu_count()} cores, load average {load:.1f} at the end")
    one = best[next(iter(shapes))]
    for name in shapes:
        print(f"  {name:<42} {best[name]:7.1f} inputs/s  {best[name] / one:5.2f}x C=1  "
              f"worker RSS {idle[name] / 2**20:4.0f} MiB imported, {rss[name] / 2**20:4.0f} "
              f"MiB after its tasks")


if __name__ == "__main__":
    main()
