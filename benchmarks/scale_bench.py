"""Driver scaling, measured in one run: N generated inputs through a tiny model on the local
Dask cluster. Goal: time to first task and driver peak RSS within 1.2x from N = 200 to 20,000.

Measures (the driver is this process; workers are separate processes, so its RSS is its own):
- plan: seconds to gather facts and create the store (`sweep.driver.runner.materialise`), lock held;
- time to first task: from the start of the run (lock, plan, cluster start, submission) to the
  first task starting on a worker (Dask's task stream, worker clocks);
- driver peak RSS after planning and at the end (`ru_maxrss`), and its RSS after imports;
- tasks/s and scheduler overhead per task: (execution wall x worker threads - sum of the tasks'
  compute time) / tasks, the worker time per task spent not computing (scheduling, transfers,
  idle waits on dependencies).

`--max-tasks K` stops after K tasks have finished (the rest are cancelled): time to first task
and RSS are then complete, tasks/s covers those K tasks.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/scale_bench.py --n 200 --kind image
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/scale_bench.py --n 20000 --kind image \
        --shard-size 200 --max-tasks 20
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from distributed import as_completed, get_task_stream
from PIL import Image

import workers.models.hf  # noqa: F401
import workers.models.timm_  # noqa: F401
import workers.models.trained.ft.adapter  # noqa: F401 - imported before timing: a constant cost
from sweep.clusters.client import load_cluster_config, open_client
from sweep.config.load import load_config
from sweep.driver.graph import submit_tasks
from sweep.driver.runner import locked, materialise, pending_tasks

MODELS = {  # kind -> (model entry, dataset entry); tiny models, random weights, no download
    "image": ("{source: tiny-vit, dataset: inputs}", "{kind: image, path: inputs}"),
    "text": ("{source: tiny-roberta, dataset: inputs}", "{kind: text, path: inputs.txt}"),
    "tabular": ("{source: ft-transformer, dataset: inputs, options: {max_epochs: 2, n_blocks: 1}}",
                "{kind: tabular, path: inputs.csv}"),
}
CLUSTER = """\
kind: local
dashboard_address: ":0"
local:
  processes: true
  pools:
    both: {workers: %d, threads: 1, resources: {GPU: 1, CPU: 1}}
"""
WORDS = "the a model token attention layer input row bound tight pair self weight".split()


def make_inputs(folder: Path, kind: str, n: int) -> None:
    """N small inputs of `kind` under `folder`: 32x32 PNGs, sentences, or table rows."""
    rng = np.random.default_rng(0)
    if kind == "image":
        images = folder / "inputs"
        for i in range(n):
            part = images / f"{i // 1000:03d}"
            part.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(part / f"img{i:06d}.png")
    elif kind == "text":
        lines = [" ".join(rng.choice(WORDS, size=rng.integers(4, 24))) for _ in range(n)]
        (folder / "inputs.txt").write_text("\n".join(lines) + "\n")
    else:
        with (folder / "inputs.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([f"f{k}" for k in range(8)] + ["target"])
            for i in range(n):
                writer.writerow([*rng.normal(size=8).round(6), i % 2])


def rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(n: int, kind: str, shard_size: int, workers: int, max_tasks: int) -> dict:
    """One measured run in a temporary folder; returns the measures."""
    out: dict = {"n": n, "kind": kind, "shard_size": shard_size, "workers": workers,
                 "rss_after_imports_mib": round(rss_mib(), 1)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        make_inputs(folder, kind, n)
        out["make_inputs_s"] = round(time.perf_counter() - start, 2)
        model, dataset = MODELS[kind]
        (folder / "sweep.yaml").write_text(
            f"store: sweep.zarr\nshard_size: {shard_size}\nretries: 0\n"
            f"datasets:\n  inputs: {dataset}\nmodels:\n  m: {model}\n")
        (folder / "cluster.yaml").write_text(CLUSTER % workers)
        config = load_config(folder / "sweep.yaml")
        t0_wall, t0 = time.time(), time.perf_counter()
        with locked(config):
            plan = materialise(config)
            out["plan_s"] = round(time.perf_counter() - t0, 3)
            out["rss_after_plan_mib"] = round(rss_mib(), 1)
            tasks = pending_tasks(plan)
            out["tasks"] = len(tasks)
            with open_client(load_cluster_config(folder / "cluster.yaml")) as client:
                out["cluster_up_s"] = round(time.perf_counter() - t0, 3)
                with get_task_stream(client) as stream:
                    futures = submit_tasks(client, plan, tasks, retries=0)
                    out["submitted_s"] = round(time.perf_counter() - t0, 3)
                    finished = 0
                    for future in as_completed(futures.values()):
                        finished += 1
                        if future.status == "error":
                            raise RuntimeError(f"{future.key}: {future.exception()}")
                        if max_tasks and finished >= max_tasks:
                            break
                    end = time.perf_counter()
                    client.cancel(list(futures.values()))
                records = stream.data
    computes = [s for r in records for s in r["startstops"] if s["action"] == "compute"]
    first = min(s["start"] for s in computes)
    busy = sum(s["stop"] - s["start"] for s in computes)
    done = len(records)
    execution = end - (first - t0_wall + t0)  # first task start to last completion seen
    out.update({
        "tasks_finished": finished,
        "time_to_first_task_s": round(first - t0_wall, 3),
        "execution_s": round(execution, 2),
        "tasks_per_s": round(finished / execution, 2),
        "overhead_per_task_ms": round(1000 * (execution * workers - busy) / max(done, 1), 1),
        "mean_task_compute_ms": round(1000 * busy / max(done, 1), 1),
        "driver_peak_rss_mib": round(rss_mib(), 1),
    })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="generated inputs")
    parser.add_argument("--kind", choices=sorted(MODELS), default="image")
    parser.add_argument("--shard-size", type=int, default=200, help="inputs per shard")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--max-tasks", type=int, default=0,
                        help="stop after this many tasks finished (0: run everything)")
    args = parser.parse_args()
    print(json.dumps(bench(args.n, args.kind, args.shard_size, args.workers, args.max_tasks)))


if __name__ == "__main__":
    main()
