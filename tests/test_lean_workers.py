"""A CPU worker carries only what testing needs: a worker that only tests, or only runs the
baselines and nulls, never imports torch, transformers or timm (issue 42).

The test tasks' modules (`workers.tasks.verdicts`, `.nulls`) and what a worker unpickles to run
them (`workers.on_worker.run_on_worker`, the task specs) import numpy, numba and zarr only;
the extraction side (`workers.tasks.extract`) keeps torch to itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import Client, Scheduler

from sweep.cli.entry import main

pytestmark = pytest.mark.timeout(240)

HEAVY = ("torch", "transformers", "timm", "rtdl_revisiting_models", "torchvision")
REPO = Path(__file__).parents[1]
MAX_RSS_MB = 350  # issue 42: a test worker after a sweep (748 MB before the split)

PROBE = """
import pickle, sys
from workers.on_worker import run_on_worker
from workers.task_specs import BaselineTask, NullTask, TestTask
import workers.tasks.nulls, workers.tasks.verdicts
from workers.tasks import STAGE_BODIES
heavy = {heavy!r}
print(",".join(name for name in heavy if name in sys.modules))
"""


def test_the_test_side_modules_import_no_torch():
    """What a CPU worker unpickles and runs for a test, baseline or null task, in a fresh
    interpreter: none of the model libraries come with it."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], cwd=REPO,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == ""


def test_every_stage_has_a_body_on_its_side():
    from workers.tasks import STAGE_BODIES

    sides = {stage: module.rsplit(".", 1)[1] for stage, (module, _) in STAGE_BODIES.items()}
    assert sides == {"prepare": "extract", "extract": "extract", "test": "verdicts",
                     "baseline": "nulls", "nulls": "nulls"}


def worker_state() -> tuple[list[str], float]:
    """On a worker: the model libraries it has imported, and its resident set in MiB."""
    import psutil

    loaded = [name for name in HEAVY if name in sys.modules]
    return loaded, psutil.Process().memory_info().rss / 2**20


def start_worker(address: str, resources: str, folder: Path) -> subprocess.Popen:
    """A `dask worker` process, as a user starts one for `kind: address`."""
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--resources", resources, "--no-dashboard", "--name", resources.split("=")[0],
         "--local-directory", str(folder)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_cpu_worker_after_a_sweep_holds_no_torch(tmp_path):
    """The issue's measurement: a scheduler, one GPU-resource and one CPU-resource `dask worker`
    process, a tiny-roberta sweep through `kind: address`; afterwards the CPU worker holds none
    of the model libraries and at most MAX_RSS_MB."""
    config = tmp_path / "sweep.yaml"
    config.write_text(f"""\
store: {tmp_path / 'sweep.zarr'}
shard_size: 3
matched_nulls: {{nulls: [uniform], trials: 200, seed: 0}}
datasets:
  topics: {{source: 'pydoc:topics', limit: 6}}
models:
  rob: {{source: tiny-roberta, dataset: topics, batch_size: 3}}
""")
    import asyncio
    import threading

    # numba's kernels compiled and cached first (as any earlier sweep leaves them): the memory
    # measured is a worker's running a sweep, not LLVM's while it compiles the kernels
    warm = tmp_path / "warm.yaml"
    warm.write_text(config.read_text().replace("sweep.zarr", "warm.zarr"))
    assert main(["run", str(warm), "--in-process"]) == 0

    ready, holder = threading.Event(), {}

    def serve() -> None:  # the scheduler in a thread of its own event loop
        async def run() -> None:
            async with Scheduler(host="127.0.0.1", port=0, dashboard=False,
                                 dashboard_address=":0") as scheduler:
                holder["address"], holder["stop"] = scheduler.address, asyncio.Event()
                ready.set()
                await holder["stop"].wait()
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        loop.run_until_complete(run())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    address = holder["address"]
    workers = [start_worker(address, r, tmp_path) for r in ("GPU=1", "CPU=1")]
    try:
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=120)
            cluster = tmp_path / "cluster.yaml"
            cluster.write_text(f"kind: address\ndashboard_address: \":0\"\n"
                               f"address: {{scheduler: {address}}}\n")
            assert main(["run", str(config), "--cluster", str(cluster)]) == 0
            by_name = {info["name"]: addr
                       for addr, info in client.scheduler_info()["workers"].items()}
            states = client.run(worker_state)
        gpu_loaded, _ = states[by_name["GPU"]]
        cpu_loaded, cpu_rss = states[by_name["CPU"]]
        assert "torch" in gpu_loaded  # the extraction side did import it: the probe works
        print(f"CPU worker: {cpu_rss:.0f} MiB")
        assert cpu_loaded == [], f"the CPU worker imported {cpu_loaded}"
        assert cpu_rss <= MAX_RSS_MB, f"the CPU worker holds {cpu_rss:.0f} MiB"
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
        time.sleep(0)
