"""Sweep overhead, measured in one run: a sweep of one model over N inputs against the bare
forward passes of that model on the same inputs plus the equality kernel alone on the same
matrices. Target: sweep wall <= 1.3 x (bare forward + kernel).

The model is ViT-B/16 at 224 px (12 layers, T = 197) with random weights, written to a local
Hugging Face directory (safetensors) so the benchmark runs offline; its compute equals the
pretrained model's. Inputs are N random RGB images written as PNG files.

    python benchmarks/sweep_bench.py --n 32 --batch-size 8 [--dask]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from sweep.config.load import parse_config
from sweep.driver.runner import InProcessExecutor, execute_plan, locked, materialise
from workers.exact.equality import check, restrict, rollout
from workers.exact.token_kinds import keep_mask, special_mask
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor
from workers.models.registry import resolve_model
from workers.tasks import run_task


def make_model(folder: Path) -> Path:
    """A randomly initialised ViT-B/16 saved as a local transformers directory."""
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig()).save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return folder


def make_images(folder: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for i in range(n):
        pixels = rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:04d}.png")
    return folder


def bare_forward(source: str, images: Path, batch_size: int) -> tuple[float, list]:
    """Seconds of preprocessing + forward passes alone (no hooks), and the extractions."""
    dataset = open_dataset(DatasetSpec(kind="image", path=str(images)))
    extractor = load_extractor(resolve_model(source), device="cpu")
    batches = [dataset.load(range(i, min(i + batch_size, len(dataset))))
               for i in range(0, len(dataset), batch_size)]
    start = time.perf_counter()
    for items in batches:
        with torch.inference_mode():
            extractor.forward(extractor.prepare(items))
    seconds = time.perf_counter() - start
    outs = [out for i, items in enumerate(batches)
            for out in extractor.extract(items, dataset.ids[i * batch_size:][:len(items)])]
    return seconds, outs


def kernel_alone(outs: list, token_sets: tuple[str, ...]) -> tuple[float, float]:
    """Seconds of `check` on every (input, token set) stack of layers, matrices prepared; and
    of `check` + `rollout` (all the math the test stage does)."""
    jobs = []
    for out in outs:
        for token_set in token_sets:
            keep = keep_mask(out.token_kind, token_set)
            mats = [restrict(a.astype(np.float64), keep) for a in out.attention]
            jobs.append((np.stack([m.matrix for m in mats]),
                         special_mask(out.token_kind)[mats[0].kept]))
    start = time.perf_counter()
    for stack, special in jobs:
        check(stack, special=special)
    kernel = time.perf_counter() - start
    start = time.perf_counter()
    for stack, special in jobs:
        check(stack, special=special)
        rollout(stack)
    return kernel, time.perf_counter() - start


def sweep_config(work: Path, source: str, images: Path, batch_size: int, name: str):
    return parse_config({
        "store": str(work / f"{name}.zarr"), "shard_size": batch_size * 2,
        "datasets": {"images": {"kind": "image", "path": str(images)}},
        "models": {"vit": {"source": source, "dataset": "images", "batch_size": batch_size,
                           "device": "cpu"}},
    })


def sweep_in_process(config) -> dict[str, float]:
    """Wall of an in-process sweep, with the time of each stage."""
    times = {"plan+store": 0.0, "extract": 0.0, "test": 0.0}
    start = time.perf_counter()
    with locked(config):
        times["plan+store"] = -time.perf_counter()
        plan = materialise(config)
        times["plan+store"] += time.perf_counter()
        for task in plan.tasks:
            t0 = time.perf_counter()
            run_task(task)
            times[task.stage] += time.perf_counter() - t0
        summary = execute_plan(plan, InProcessExecutor(), progress=False)  # all done: skips
    assert summary.completed == []
    times["wall"] = time.perf_counter() - start
    return times


def sweep_dask(config) -> float:
    """Wall of a sweep on the embedded local cluster, cluster start included."""
    from sweep.clusters.client import load_cluster_config, open_client
    from sweep.driver.graph import DaskExecutor
    from workers.tasks import cache, extract

    # The default local cluster on a machine without CUDA runs its workers as threads of this
    # process: drop the model and dataset the in-process sweep cached so the Dask sweep loads its
    # own, as a fresh `sweep run` would.
    extract._EXTRACTORS.clear()
    cache._DATASETS.clear()
    start = time.perf_counter()
    with locked(config):
        plan = materialise(config)
        with open_client(load_cluster_config(None)) as client:
            summary = execute_plan(plan, DaskExecutor(client), progress=False)
    assert summary.exit_code == 0
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="inputs")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dask", action="store_true", help="also time a sweep on Dask")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = f"hf:{make_model(work / 'vit-b16')}"
        images = make_images(work / "images", args.n)
        forward_before, outs = bare_forward(source, images, args.batch_size)
        kernel, math = kernel_alone(outs, ("all", "content"))
        stages = sweep_in_process(sweep_config(work, source, images, args.batch_size, "local"))
        forward_after, _ = bare_forward(source, images, args.batch_size)
        forward = min(forward_before, forward_after)  # the faster: a conservative ratio
        print(f"ViT-B/16 (T=197, 12 layers), {args.n} inputs, batch {args.batch_size}, "
              f"torch threads {torch.get_num_threads()}")
        print(f"bare forward (preprocess + forward):   {forward:8.2f} s   "
              f"(min of {forward_before:.2f} before, {forward_after:.2f} after the sweep)")
        print(f"kernel alone (check, 2 token sets):    {kernel:8.2f} s")
        print(f"math alone (check + rollout):          {math:8.2f} s")
        print(f"sweep in-process, wall:                {stages['wall']:8.2f} s   "
              f"ratio {stages['wall'] / (forward + kernel):.2f} x (forward + kernel), "
              f"{stages['wall'] / (forward + math):.2f} x (forward + math)")
        print(f"  plan + store creation:               {stages['plan+store']:8.2f} s")
        print(f"  extract stage:                       {stages['extract']:8.2f} s   "
              f"ratio {stages['extract'] / forward:.2f} x forward")
        print(f"  test stage:                          {stages['test']:8.2f} s   "
              f"ratio {stages['test'] / kernel:.2f} x kernel, {stages['test'] / math:.2f} x math")
        if args.dask:
            wall = sweep_dask(sweep_config(work, source, images, args.batch_size, "dask"))
            print(f"sweep on Dask (local cluster), wall:   {wall:8.2f} s   "
                  f"ratio {wall / (forward + kernel):.2f} x (forward + kernel), "
                  f"{wall / (forward + math):.2f} x (forward + math)")


if __name__ == "__main__":
    main()
