"""Test-stage throughput of a CPU pool of C single-threaded worker processes against one, in one
run (C = 1 and C = 2 by default, round by round in turn), and where each pool's time goes:
inside the tasks, between them, before the first and after the last, in the driver, the
scheduler and the nannies; beside each, C bare processes doing the same work without Dask.

    PYTHONPATH=. python benchmarks/pool_bench.py [--cores 2] [--t 197] [--shard-size 32]
        [--tasks-per-worker 4] [--rounds 8] [--bare-env] [--no-bare]
    PYTHONPATH=. python benchmarks/pool_bench.py --cores 2,16 --rounds 4   # on 16 cores
    PYTHONPATH=. python benchmarks/pool_bench.py --memory 197,577,1370

Each Dask pool is started as cluster.yaml tells a user to start one (`kind: address`; a SLURM
CPU job runs the same command): a scheduler process (`dask scheduler`) and `dask worker ADDRESS
--nworkers C --nthreads 1 --resources CPU=1` with the thread variables at 1 (`--bare-env`:
without them); one process holds its C nannies, each with its worker process. Each bare pool is
C spawned processes (multiprocessing) that run the test task's body (`run_test`) as they free
up: what this machine gives C processes doing this work, the ceiling of a pool. All pools start
first and stay stopped (SIGSTOP) while another runs; then round by round, pool after pool (the
order turned each round), the driver (this process) submits C x `--tasks-per-worker` test tasks
as a sweep does (`workers.on_worker.run_on_worker`: read, restriction, check, radius,
rollout, results, marker) and gathers them. A store in a temporary folder per shard size holds
the largest round's inputs of `benchmarks/stage_vs_tree.py`'s attention-like data (`shard(T)`,
12 layers), in shards of `--shard-size` (`8,32`: every pool runs each). The first round warms up
(numba's cache, scratch buffers) and is not counted.

Per pool and shard size, the median over the rounds of: inputs/s; its ratio to the same kind's
C = 1 in the same round (rounds of C = 1 and C next to each other in time, so a change of the
machine's load falls on both); the pool's core-seconds (C x wall) split into `in tasks` (compute
time of the tasks: the scheduler's task stream, or the bare processes' own clocks), `between`
(a worker's gaps between its tasks: dispatch and the result's way back) and `ramp` (before a
worker's first task and after its last: the round's start and its tail); compute seconds and the
worker processes' CPU-seconds per task (the same work at every C: they grow when C processes
contend for memory bandwidth and caches, or share their cores with other load); the CPU of the
driver, the scheduler and the nannies as a share of one core and of all the CPU the round used.
The load average is printed per round: on a shared machine a pool cannot reach C x one process.

`--memory`: instead, for each T, fresh single-threaded processes (this tree) import what a test
worker imports, run a warm-up test task at T = 8 (numba's kernels loaded), then one test task
over a shard of `shard(T)` (written beforehand, by another process), or in another such process
50 uniform null trials at n = T; printed: the resident set after the imports, after the warm-up,
and the peak during the task or the trials (`VmHWM`, reset before it: `ru_maxrss` would carry
the parent's peak across exec).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
from distributed import Client, get_task_stream
from stage_vs_tree import LAYERS, TOKEN_SETS, shard

from storage.location import StoreRef
from storage.store import create_root, ensure_model, open_model, write_attention, write_tokens
from sweep.clusters.config import THREAD_VARIABLES
from workers.task_specs import TestTask

REPO = Path(__file__).resolve().parents[1]
Spans = dict[str, list[tuple[float, float]]]  # worker -> (start, stop) of each task it ran


def write_store(path: Path, t: int, inputs: int, shard_size: int) -> list[TestTask]:
    """A store at `path` of `inputs` inputs (copies of `shard(t)`'s) as model `m` in shards of
    `shard_size`; one TestTask per shard."""
    attention, n_tokens, kinds = shard(t)
    store = StoreRef.of(str(path))
    root = create_root(store)
    ensure_model(root, "m", input_ids=[f"i{i}" for i in range(inputs)], n_layers=LAYERS,
                 t_max=t, shard_size=shard_size, token_sets=TOKEN_SETS, attrs={},
                 fingerprint_inputs={})
    root.attrs["models"] = ["m"]
    group = open_model(store, "m", mode="r+")
    tasks = []
    for s, start in enumerate(range(0, inputs, shard_size)):
        stop = min(start + shard_size, inputs)
        take = np.arange(start, stop) % len(n_tokens)
        write_attention(group, start, attention[take])
        write_tokens(group, start, n_tokens[take], kinds[take])
        tasks.append(TestTask(key=f"test-m-{s:05d}", store=store, model="m", shard=s,
                              start=start, stop=stop, token_sets=TOKEN_SETS, tol=1e-12))
    return tasks


def thread_env(tree: Path = REPO) -> dict[str, str]:
    """This environment with `tree` (default this one) alone on the path and every thread
    variable at 1."""
    return {**os.environ, "PYTHONPATH": str(tree), **{name: "1" for name in THREAD_VARIABLES}}


def bare_env(tree: Path = REPO) -> dict[str, str]:
    """This environment with `tree` alone on the path and no thread variable."""
    env = {key: value for key, value in os.environ.items() if key not in THREAD_VARIABLES}
    return {**env, "PYTHONPATH": str(tree)}


def start_scheduler(folder: Path, name: str) -> tuple[subprocess.Popen, str]:
    """A `dask scheduler` process on 127.0.0.1 (its file `folder/name`) and its address."""
    scheduler_file = folder / name
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file)],
        cwd=folder, env=thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            return scheduler, json.loads(scheduler_file.read_text())["address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            if time.monotonic() > deadline or scheduler.poll() is not None:
                scheduler.kill()
                raise RuntimeError("the dask scheduler did not start") from None
            time.sleep(0.1)


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@dataclass
class Pool:
    """A scheduler process and a `dask worker --nworkers C` process, with a client."""

    cores: int
    scheduler: subprocess.Popen
    workers: subprocess.Popen
    client: Client
    worker_pids: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, cores: int, folder: Path, bare: bool = False) -> Pool:
        """Start the pool; `bare`: its workers without the thread variables (cluster.yaml's
        `dask worker` line as written, in an environment that sets none)."""
        scheduler, address = start_scheduler(folder, f"scheduler-{cores}.json")
        workers = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers",
             str(cores), "--nthreads", "1", "--resources", "CPU=1", "--no-dashboard",
             "--memory-limit", "0", "--local-directory", str(folder)],
            cwd=folder, env=bare_env() if bare else thread_env(), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        client = Client(address, timeout="60s")
        client.wait_for_workers(cores, timeout=300)
        pool = cls(cores, scheduler, workers, client)
        pool.worker_pids = sorted(client.run(os.getpid).values())
        return pool

    def cpu(self) -> dict[str, float]:
        """CPU-seconds so far of the scheduler, the nannies' process and the worker processes."""
        return {"scheduler": cpu_seconds(psutil.Process(self.scheduler.pid)),
                "nannies": cpu_seconds(psutil.Process(self.workers.pid)),
                "workers": sum(cpu_seconds(psutil.Process(p)) for p in self.worker_pids)}

    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(pid) for pid in (self.scheduler.pid, self.workers.pid,
                                                *self.worker_pids)]

    def execute(self, tasks: list[TestTask], tag: str) -> tuple[float, float, Spans]:
        """Submit every task as a sweep does and gather them: (start, end, each worker's
        compute spans, from the scheduler's task stream)."""
        from workers.on_worker import run_on_worker

        with get_task_stream(self.client) as stream:
            start = time.time()
            futures = [self.client.submit(run_on_worker, task, key=f"{task.key}-{tag}",
                                          resources={"CPU": 1}, pure=False) for task in tasks]
            self.client.gather(futures)
            end = time.time()
        spans: Spans = {}
        for record in stream.data:
            for part in record["startstops"]:
                if part["action"] == "compute":
                    spans.setdefault(record["worker"], []).append((part["start"], part["stop"]))
        return start, end, spans

    def pause(self) -> None:
        """Stop every process of the pool (SIGSTOP), so an idle pool takes no CPU from the
        pool being measured."""
        for process in self.processes():
            process.suspend()

    def resume(self) -> None:
        for process in self.processes():
            process.resume()
        self.client.wait_for_workers(self.cores, timeout=60)

    def close(self) -> None:
        """Resume, disconnect and stop the pool; a process already gone (the error that ends
        the run says why) is left out, so that error is the one reported."""
        for pid in (self.scheduler.pid, self.workers.pid, *self.worker_pids):
            try:
                psutil.Process(pid).resume()
            except psutil.NoSuchProcess:
                pass
        self.client.close()
        for process in (self.workers, self.scheduler):
            process.terminate()
        for process in (self.workers, self.scheduler):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def worker_threads() -> dict[str, object]:
    """On a worker: numba's pool and launch threads, BLAS's threads, OS threads of the process."""
    import numba
    import threadpoolctl

    import workers.tasks.verdicts  # noqa: F401  what a test task loads (numba, BLAS)

    blas = {info["internal_api"]: info["num_threads"]
            for info in threadpoolctl.threadpool_info()}
    return {"numba pool": numba.config.NUMBA_NUM_THREADS, "numba layer":
            numba.config.THREADING_LAYER, "blas": blas,
            "os threads": psutil.Process().num_threads()}


def bare_process(started: multiprocessing.Queue) -> None:
    """A bare pool's process, as it starts: import the test side, say who it is."""
    import workers.tasks.verdicts  # noqa: F401

    started.put(os.getpid())


def timed_test(task: TestTask) -> tuple[int, float, float]:
    """In a bare process: the test task's body (`run_test`); (this process, start, stop)."""
    from workers.tasks.verdicts import run_test

    start = time.time()
    run_test(task)
    return os.getpid(), start, time.time()


class BarePool:
    """C plain processes (multiprocessing, spawned, the thread variables at 1) that run the
    test task's body with no Dask, one task at a time each as they free up: what this machine
    gives C processes doing this work, the ceiling of a pool."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        context = multiprocessing.get_context("spawn")
        started = context.Queue()
        self.pool = context.Pool(cores, initializer=bare_process, initargs=(started,))
        self.pids = sorted(started.get(timeout=300) for _ in range(cores))

    def cpu(self) -> dict[str, float]:
        return {"workers": sum(cpu_seconds(psutil.Process(p)) for p in self.pids)}

    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(pid) for pid in self.pids]

    def pause(self) -> None:
        for process in self.processes():
            process.suspend()

    def resume(self) -> None:
        for process in self.processes():
            process.resume()

    def execute(self, tasks: list[TestTask], tag: str) -> tuple[float, float, Spans]:
        start = time.time()
        done = self.pool.map(timed_test, tasks, chunksize=1)
        end = time.time()
        spans: Spans = {}
        for pid, begin, stop in done:
            spans.setdefault(str(pid), []).append((begin, stop))
        return start, end, spans

    def close(self) -> None:
        self.resume()
        self.pool.terminate()
        self.pool.join()


def run_round(pool: Pool | BarePool, tasks: list[TestTask], tag: str) -> dict[str, float]:
    """Run every task once on `pool`; the round's wall time and how its time was spent."""
    before, driver, load = pool.cpu(), time.process_time(), os.getloadavg()[0]
    start, end, spans_of = pool.execute(tasks, tag)
    after = pool.cpu()
    wall = end - start
    busy = sum(stop - begin for spans in spans_of.values() for begin, stop in spans)
    between = 0.0
    for spans in spans_of.values():
        spans.sort()
        between += sum(max(0.0, b - a) for (_, a), (b, _) in zip(spans, spans[1:],
                                                                 strict=False))
    ramp = pool.cores * wall - busy - between  # idle workers and the edges of each worker's run
    used = {name: after.get(name, 0.0) - before.get(name, 0.0)
            for name in ("workers", "scheduler", "nannies")}
    used["driver"] = time.process_time() - driver  # this process, every thread of it
    return {"wall": wall, "inputs/s": sum(t.stop - t.start for t in tasks) / wall,
            "in tasks": busy / (pool.cores * wall), "between": between / (pool.cores * wall),
            "ramp": ramp / (pool.cores * wall), "s/task": busy / len(tasks),
            "cpu/task": used["workers"] / len(tasks),
            **{f"cpu {name}": value for name, value in used.items()}, "load": load}


def median_row(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


Key = tuple[str, int, int]  # (pool kind, shard size, C)


def report(args: argparse.Namespace, results: dict[Key, list[dict[str, float]]],
           threads: dict[int, dict[str, object]]) -> None:
    """The table: one line per (pool kind, shard size, C), medians over the counted rounds."""
    loads = [r["load"] for rounds in results.values() for r in rounds]
    print(f"T = {args.t}, {LAYERS} layers, {args.tasks_per_worker} tasks per worker process a "
          f"round, medians of {args.rounds} rounds after a warm-up; {os.cpu_count()} cores, "
          f"load average {min(loads):.1f}-{max(loads):.1f} at the rounds' starts"
          f"{'; Dask workers without the thread variables' if args.bare_env else ''}")
    for c, info in threads.items():
        print(f"  C = {c} Dask workers: {info}")
    print(f"{'pool':<5} {'shard':>5} {'C':>3} {'inputs/s':>9} {'x C=1':>6} {'in tasks':>8} "
          f"{'between':>8} {'ramp':>6} {'s/task':>7} {'cpu/task':>8} {'driver':>13} "
          f"{'scheduler':>13} "
          f"{'nannies':>13}")
    for (kind, size, c), rounds in results.items():
        one = results[(kind, size, 1)]
        ratios = [r["inputs/s"] / o["inputs/s"] for r, o in zip(rounds, one, strict=True)]
        row = median_row(rounds)
        total = sum(row[k] for k in row if k.startswith("cpu "))

        def share(name: str, row: dict[str, float] = row, total: float = total,
                  kind: str = kind) -> str:
            cpu = row[f"cpu {name}"]
            if kind == "bare" and name != "driver":
                return "-"
            return f"{cpu / row['wall']:5.1%}c {cpu / total:5.1%}"

        print(f"{kind:<5} {size:>5} {c:>3} {row['inputs/s']:>9.1f} "
              f"{statistics.median(ratios):>6.2f} {row['in tasks']:>8.1%} {row['between']:>8.1%} "
              f"{row['ramp']:>6.1%} {row['s/task']:>7.3f} {row['cpu/task']:>8.3f} "
              f"{share('driver'):>13} "
              f"{share('scheduler'):>13} {share('nannies'):>13}")
    print("x C=1: median over rounds of the ratio to the same kind's C = 1 in that round; in "
          "tasks / between / ramp: shares of the pool's C x wall core-seconds; s/task: compute "
          "wall per task; cpu/task: the worker processes' CPU-s per task; driver, "
          "scheduler, nannies: CPU-s / wall (c: of one core), then their share of all the CPU "
          "the round used (its worker processes' included); bare: C processes with no Dask")
    for (kind, size, c), rounds in results.items():
        print(f"  {kind} shard {size}, C = {c}: inputs/s per round "
              + ", ".join(f"{r['inputs/s']:.1f} (load {r['load']:.1f})" for r in rounds))


PROBE = """
import json, pickle, sys
def rss(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024
import workers.tasks.verdicts, workers.on_worker
warm, task = pickle.loads(sys.stdin.buffer.read())
out = {"imports": rss("VmRSS:")}
workers.tasks.verdicts.run_test(warm)
out["warm"] = rss("VmRSS:")
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # VmHWM := VmRSS
if sys.argv[1] == "null":  # 50 uniform null trials at n = T, as a baseline task draws them
    from workers.nulls.baseline import holding_in_blocks
    holding_in_blocks(int(sys.argv[2]), 0, [(0, 50)])
else:
    workers.tasks.verdicts.run_test(task)
out[sys.argv[1]] = rss("VmHWM:")
print(json.dumps(out))
"""


def peak_rss(t: int) -> dict[str, float]:
    """MiB of fresh one-thread processes: after their imports, after a warm-up task at T = 8,
    and the peak during one test task over a shard of `shard(t)` (the stores written here
    first); in another such process, the peak during 50 uniform null trials at n = t."""
    import pickle

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        (warm,) = write_store(Path(folder) / "warm.zarr", 8, 8, 8)
        size = len(shard(t)[1])
        (task,) = write_store(Path(folder) / "bench.zarr", t, size, size)
        for mode in ("null", "peak"):
            done = subprocess.run([sys.executable, "-c", PROBE, mode, str(t)],
                                  input=pickle.dumps((warm, task)), env=thread_env(),
                                  capture_output=True, check=True, cwd=folder)
            out.update(json.loads(done.stdout))
    return out


def main() -> None:
    """Parse the options, run the pools round by round, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--t", type=int, default=197, help="tokens per input")
    parser.add_argument("--shard-size", default="32", help="inputs per task, e.g. 8,32")
    parser.add_argument("--tasks-per-worker", type=int, default=4,
                        help="tasks per worker process in a round (a round of C processes: C "
                        "times as many)")
    parser.add_argument("--rounds", type=int, default=8, help="counted rounds after the warm-up")
    parser.add_argument("--cores", default="2", help="C values beside 1, e.g. 2,16")
    parser.add_argument("--bare-env", action="store_true",
                        help="workers without the thread variables (NUMBA_NUM_THREADS ...)")
    parser.add_argument("--no-bare", action="store_true",
                        help="leave out the bare pools (C processes running the tasks, no Dask)")
    parser.add_argument("--memory", default=None, help="T values, e.g. 197,577,1370: peak RSS")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped pools are closed on exit
    if args.memory:
        for t in (int(v) for v in args.memory.split(",")):
            mib = peak_rss(t)
            print(f"T = {t}: {mib['imports']:.0f} MiB after the imports, {mib['warm']:.0f} MiB "
                  f"after a warm-up task at T = 8, peak {mib['peak']:.0f} MiB during one test "
                  f"task ({len(shard(t)[1])} inputs, {LAYERS} layers, 1 head, both token "
                  f"sets); peak {mib['null']:.0f} MiB during 50 uniform null trials at n = {t} "
                  f"after the same warm-up")
        return
    cores = [1, *(int(c) for c in args.cores.split(",") if int(c) > 1)]
    sizes = [int(s) for s in args.shard_size.split(",")]
    kinds = ["dask"] if args.no_bare else ["dask", "bare"]
    results: dict[Key, list[dict[str, float]]] = {
        (kind, size, c): [] for kind in kinds for size in sizes for c in cores}
    os.environ.update({name: "1" for name in THREAD_VARIABLES})  # the bare pools inherit them
    with tempfile.TemporaryDirectory() as folder:
        stores = {size: write_store(Path(folder) / f"s{size}.zarr", args.t,
                                    max(cores) * args.tasks_per_worker * size, size)
                  for size in sizes}
        pools: dict[tuple[str, int], Pool | BarePool] = {}
        try:
            for c in cores:
                pools[("dask", c)] = Pool.start(c, Path(folder), bare=args.bare_env)
                pools[("dask", c)].pause()
                if "bare" in kinds:
                    pools[("bare", c)] = BarePool(c)
                    pools[("bare", c)].pause()
            threads = {}
            for rnd in range(args.rounds + 1):
                order = [(kind, c) for c in cores for kind in kinds]
                for kind, c in order if rnd % 2 == 0 else order[::-1]:
                    pool = pools[(kind, c)]
                    pool.resume()
                    if kind == "dask" and c not in threads:
                        threads[c] = next(iter(pool.client.run(worker_threads).values()))
                    for size in sizes:
                        tasks = stores[size][:c * args.tasks_per_worker]
                        row = run_round(pool, tasks, f"{size}-{rnd}")
                        if rnd:
                            results[(kind, size, c)].append(row)
                    pool.pause()
        finally:
            for pool in pools.values():
                pool.close()
    report(args, results, threads)


if __name__ == "__main__":
    main()
