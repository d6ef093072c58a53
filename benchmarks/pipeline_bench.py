"""The extraction task against its bare eager forward pass, this tree against another, in one run
(issue 41): thin models of the study's real shapes, whose forward pass is cheap as a GPU's is.

Models (random weights, saved as local transformers folders; `--models`):
  vit-b         ViT-B/16's shape at 224 px: 12 layers, T = 197 (hidden 16, one head)
  dinov2-l-reg  DINOv2-L with 4 registers at 224 px: 24 layers, T = 261
  dinov2-518    DINOv2 at 518 px: 12 layers, T = 1370 (90 MB of attention per input: batch 4)
  roberta       RoBERTa's shape: 12 layers, T up to 128 (pydoc's topics, the tiny BPE)
Inputs: `--images` JPEG pictures of 500 x 375, cut deterministically from scikit-learn's two
sample photos (`make_images`).

Per model, each tree runs in a fresh process of its own (PYTHONPATH=<tree>), before and after
alternately, `--repeats` times; inside one, `--rounds` rounds alternate the bare forward pass
(`model(**inputs, output_attentions=True)` on the same batches, preprocessed beforehand, under
the same one torch thread) and the extraction task as `sweep run --in-process` runs it (every
shard's `run_task`, the model already loaded), each round writing new chunk files as a sweep
does (`--rewrite`: replacing the last round's, as a rerun does), nothing deleted while any process
measures (since 2026-12-07, tenth session: `Measured.unwrite` and `make_room` say why; start it
on a file system where nothing was deleted in the last minute). Reported per tree: the median
of each process's median rounds: inputs/s of both; their ratio, paired (each extraction round's
pace against the bare round just before it: this machine's pace drifts by tens of percent
between processes, less between neighbouring rounds), and the ratio of the two medians beside
it (the statistic before 2026-12-06's fourth session); and CPU ms per input outside the forward
pass (the process's CPU time of an extraction round less that of the bare round before it,
every thread counted).

`--simulate`: a simulated device instead, on this tree only: the forward pass sleeps t ms per
batch (the GIL released, as a GPU call) and hands the sink precomputed maps; throughput against
1 / max(t, CPU work per batch / cores) for t from 0 to several times the CPU work.

    PYTHONPATH=. python benchmarks/pipeline_bench.py --before /tmp/pipeline-before
    PYTHONPATH=. python benchmarks/pipeline_bench.py --simulate --models vit-b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PICTURE = (500, 375)  # width, height of every input picture
THIN = dict(hidden_size=16, num_attention_heads=1, intermediate_size=32)
BATCH = {"vit-b": 64, "dinov2-l-reg": 64, "dinov2-518": 4, "roberta": 64}
DEFAULT_INPUTS = {"vit-b": 128, "dinov2-l-reg": 128, "dinov2-518": 16, "roberta": 128}
RECENT_S = 65  # ext4 without a journal skips, one by one, the inodes freed in the last 60 s
# (the kernel's RECENTCY_MIN; 300 s while their inode table is unwritten: the deletions are synced)


def make_images(folder: Path, n: int) -> Path:
    """`n` JPEG pictures of 500 x 375 (quality 90), windows of scikit-learn's two sample photos
    (427 x 640) at deterministic offsets, every other group of eight mirrored: the same files
    on every machine with the same libjpeg."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    folder.mkdir(parents=True, exist_ok=True)
    width, height = PICTURE
    for i in range(n):
        photo, j = photos[i % 2], i // 2
        top, left = (j * 7) % (photo.shape[0] - height + 1), (j * 13) % (photo.shape[1] - width + 1)
        window = photo[top:top + height, left:left + width]
        if (j // 8) % 2:
            window = window[:, ::-1]
        Image.fromarray(np.ascontiguousarray(window)).save(folder / f"img{i:04d}.jpg", quality=90)
    return folder


def dinov2_processor(crop: int = 224):
    """DINOv2's image processor (facebook/dinov2-*: shortest edge 256, bicubic, crop 224)."""
    from transformers import BitImageProcessor

    return BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": crop,
                             "width": crop}, do_center_crop=True, resample=3,
                             image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))


def save_hf_model(folder: Path, name: str, config, preprocessing) -> Path:
    """A randomly initialised transformers model of `config` (seed 0) and its image processor
    or tokenizer, saved (safetensors) where `sweep` loads `hf:<folder>` from."""
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    target = folder / name
    AutoModel.from_config(config).save_pretrained(target)
    preprocessing.save_pretrained(target)
    return target


def thin_model(folder: Path, name: str) -> tuple[Path, dict]:
    """The thin model `name` saved under `folder`, and the options its sweep entry needs."""
    from transformers import (
        Dinov2Config,
        Dinov2WithRegistersConfig,
        RobertaConfig,
        ViTConfig,
        ViTImageProcessor,
    )

    from workers.models.tiny_text import tiny_tokenizer

    if name == "vit-b":
        config = ViTConfig(num_hidden_layers=12, image_size=224, patch_size=16, **THIN)
        return save_hf_model(folder, name, config, ViTImageProcessor()), {}
    if name == "dinov2-l-reg":
        config = Dinov2WithRegistersConfig(num_hidden_layers=24, patch_size=14, image_size=518,
                                           num_register_tokens=4, **THIN)
        return save_hf_model(folder, name, config, dinov2_processor()), {"image_size": 224}
    if name == "dinov2-518":
        config = Dinov2Config(num_hidden_layers=12, patch_size=14, image_size=518, **THIN)
        return save_hf_model(folder, name, config, dinov2_processor()), {"image_size": 518}
    if name == "roberta":
        tokenizer = tiny_tokenizer("roberta", 128)
        config = RobertaConfig(num_hidden_layers=12, max_position_embeddings=130,
                               vocab_size=len(tokenizer), **THIN)
        return save_hf_model(folder, name, config, tokenizer), {}
    raise SystemExit(f"unknown model {name!r}: use {sorted(BATCH)}")


def sweep_config(folder: Path, model: Path, options: dict, name: str, n: int, batch: int,
                 images: Path, shard: int | None = None, device: str = "auto") -> dict:
    """One model over its `n` inputs, in shards of `shard` (default: one) of batches of
    `batch`, on `device`."""
    dataset = ({"kind": "text", "source": "pydoc:topics", "limit": n} if name == "roberta"
               else {"kind": "image", "path": str(images), "limit": n})
    return {"store": str(folder / "store.zarr"), "shard_size": shard or n, "batch_size": batch,
            "device": device, "token_sets": ["all"], "matched_nulls": None,
            "datasets": {"inputs": dataset},
            "models": {name: {"source": f"hf:{model}", "dataset": "inputs",
                              **({"options": options} if options else {})}}}


# --- one process, one tree ---------------------------------------------------------------------
class Measured:
    """One sweep config's extraction tasks, ready to time in this process: `bare()` (the
    forward passes alone on the same batches, preprocessed beforehand) and `extract()` (every
    shard's task as `sweep run --in-process` runs it), the model loaded once for both."""

    def __init__(self, config: dict, scratch: str) -> None:
        import torch

        from sweep.config.load import parse_config
        from sweep.driver.runner import locked, materialise
        from workers.models.determinism import fixed_torch
        from workers.tasks.extract import cached_extractor, fresh_digests

        folder = self.folder = Path(tempfile.mkdtemp(dir=scratch))
        parsed = parse_config(config | {"store": str(folder / "store.zarr")})
        with locked(parsed):
            self.tasks = [t for t in materialise(parsed).tasks if t.stage == "extract"]
        self.extractor, _ = cached_extractor(self.tasks[0])
        dataset, _ = fresh_digests(self.tasks[0])
        self.batches = []
        with fixed_torch(1):
            for task in self.tasks:
                for first in range(task.start, task.stop, task.batch_size):
                    last = min(first + task.batch_size, task.stop)
                    self.batches.append(self.extractor.prepare(dataset.load(range(first, last))))
        self.n = sum(t.stop - t.start for t in self.tasks)
        self.cuda = self.extractor.device.type == "cuda"
        self.input_bytes = int(np.prod(
            zarr_shape(self.tasks[0])[1:])) * 4  # padded float32 attention per input
        self._torch = torch

    def bare(self) -> None:
        from workers.models.determinism import fixed_torch

        with fixed_torch(1), self._torch.inference_mode():
            for batch in self.batches:
                self.extractor.model(**batch.inputs, output_attentions=True)
        if self.cuda:
            self._torch.cuda.synchronize()

    def extract(self) -> None:
        from workers.tasks import run_task

        for task in self.tasks:
            run_task(task)

    def unwrite(self) -> None:
        """Move what the extraction tasks wrote (their arrays' chunks) into a folder deleted
        with the benchmark's scratch (or by `make_room`), and clear their markers, so the next
        round writes new files as a sweep does; left out with `--rewrite`, a round replaces the
        last round's files (on ext4, replacing a file through a rename flushes its data: about
        1 ms of wall per ViT-B chunk here that a sweep's first write does not wait for).

        Nothing is deleted while rounds run: on an ext4 without a journal (this machine's root),
        a new file or folder skips, one by one, every free inode deleted in the last 60 s (300 s
        while its inode table is not yet written back: the kernel's `recently_deleted`): after
        the last round's deletion, making a RoBERTa batch's chunk folders took 63-190 ms of CPU,
        against 6-24 ms without (2026-12-07), a cost a sweep's first pass does not pay."""
        from storage.layout import DEVICE_ROLLOUT
        from storage.markers import clear

        store, model = Path(str(self.tasks[0].store)), self.tasks[0].model
        self.moved = getattr(self, "moved", 0) + 1
        trash = self.folder / "written" / str(self.moved)
        trash.mkdir(parents=True)
        for name in ("attention", "n_tokens", "token_kind", "input_digest", DEVICE_ROLLOUT):
            if (store / model / name / "c").exists():
                (store / model / name / "c").rename(trash / name)
        for task in self.tasks:
            clear(task.store, task.scope, task.marker)

    def rounds(self, count: int, rewrite: bool = False) -> dict[str, list[tuple[float, float]]]:
        """(wall s, process CPU s) of `count` rounds of each, alternating, after a warm-up;
        each extraction round into new chunk files (`unwrite` before it, not timed) unless
        `rewrite`."""
        times: dict[str, list[tuple[float, float]]] = {"bare": [], "extract": []}
        self.bare(), self.extract()  # warm-up: caches, allocator, the first write of each chunk
        for _ in range(count):
            for name, fn in (("bare", self.bare), ("extract", self.extract)):
                if name == "extract" and not rewrite:
                    self.unwrite()
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        return times


def zarr_shape(task) -> tuple[int, ...]:
    import zarr

    return zarr.open_group(str(task.store), mode="r")[task.model]["attention"].shape


def child(args: argparse.Namespace) -> None:
    """Measure this process's tree (PYTHONPATH); print one JSON line."""
    spec = json.loads(args.child)
    measured = Measured(spec["config"], spec["scratch"])
    time.sleep(max(0.0, spec.get("quiet_until", 0.0) - time.time()))  # `make_room`'s deletions
    if spec.get("simulate"):
        print(json.dumps(simulate(measured, spec)), flush=True)
        return
    load = os.getloadavg()[0]
    times = measured.rounds(spec["rounds"], spec.get("rewrite", False))
    print(json.dumps({"n": measured.n, "times": times, "load": [load, os.getloadavg()[0]],
                      "folder": str(measured.folder)}), flush=True)


def simulated_device(measured: Measured) -> dict:
    """Swap the extractor's forward pass for a simulated device: each forward pass sleeps
    `state["t"]` s (the GIL released, as a GPU call) and gives the installed sink precomputed
    maps (softmax of normal draws, as wide as the widest batch's tokens), one per layer. Returns
    that `state` (t = 0 at first)."""
    import torch

    extractor, batches = measured.extractor, measured.batches
    rows = len(batches[0].positions)
    # the widest batch's tokens (text batches are padded to their longest input)
    tokens = max(len(p) for batch in batches for p in batch.positions)
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(rows, 1, tokens, tokens, generator=gen), dim=-1)
    sinks: list = []
    state = {"t": 0.0}

    def install_hooks(sink):
        sinks.append(sink)
        return []

    def forward(batch):
        time.sleep(state["t"])
        for _ in range(extractor.n_layers):
            sinks[-1](probs[:len(batch.positions)])

    extractor.install_hooks, extractor.forward = install_hooks, forward
    return state


def simulate(measured: Measured, spec: dict) -> dict:
    """The extraction task with a simulated device (`simulated_device`); each round into new
    chunk files unless `rewrite`."""
    state = simulated_device(measured)

    def timed() -> tuple[float, float]:
        """(wall s, process CPU s) per batch of `rounds` extraction rounds."""
        wall = cpu = 0.0
        for _ in range(spec["rounds"]):
            if not spec.get("rewrite"):
                measured.unwrite()
            start, used = time.perf_counter(), time.process_time()
            measured.extract()
            wall += time.perf_counter() - start
            cpu += time.process_time() - used
        return wall / (spec["rounds"] * batch_count), cpu / (spec["rounds"] * batch_count)

    batch_count = len(measured.batches)
    measured.extract()  # warm-up
    zero, work = timed()  # work: CPU-s per batch
    out = {"n": measured.n, "batches": batch_count, "work_s": work, "t0_wall_s": zero, "points": []}
    for factor in spec["factors"]:
        state["t"] = factor * work
        out["points"].append({"t_s": state["t"], "wall_s": timed()[0]})
    out["load"] = os.getloadavg()[0]
    out["folder"] = str(measured.folder)
    return out


# --- the parent: inputs, processes, the table ---------------------------------------------------
def make_room(scratch: Path, kept: list[Path], need: int) -> float:
    """Delete the finished processes' stores (`kept`) where the scratch's file system has less
    than `need` bytes free, flushed; the time (epoch s) before which the next process must not
    start measuring: `RECENT_S` after a deletion (`Measured.unwrite`), else now."""
    import shutil

    if shutil.disk_usage(scratch).free >= need or not kept:
        return time.time()
    for folder in kept:
        shutil.rmtree(folder, ignore_errors=True)
    kept.clear()
    os.sync()
    return time.time() + RECENT_S


def folder_bytes(folder: Path) -> int:
    """Bytes of the files below `folder`."""
    return sum(entry.stat().st_size for entry in folder.rglob("*") if entry.is_file())


def run_child(tree: Path, spec: dict, kept: list[Path] | None = None) -> dict:
    """One process measuring `tree`; its store is left for `make_room` (listed in `kept`), which
    runs first: room for twice the bytes the last process left, and 1 GiB."""
    if kept is not None:
        last = folder_bytes(kept[-1]) if kept else 0
        spec = spec | {"quiet_until": make_room(Path(spec["scratch"]), kept,
                                                2 * last + (1 << 30))}
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                           json.dumps(spec)], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise SystemExit(f"the child for {tree} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if kept is not None:
        kept.append(Path(out["folder"]))
    return out


def summary(results: list[dict]) -> dict[str, float]:
    """Medians over processes of each process's median round."""
    def med(name: str, index: int) -> float:
        return statistics.median(statistics.median(t[index] for t in r["times"][name])
                                 for r in results)

    n = results[0]["n"]
    bare, extract = n / med("bare", 0), n / med("extract", 0)
    ratio = statistics.median(  # each extraction round against the bare round just before it
        statistics.median(b[0] / e[0] for e, b in zip(r["times"]["extract"], r["times"]["bare"],
                                                      strict=True))
        for r in results)
    outside = statistics.median(
        statistics.median(e[1] - b[1] for e, b in zip(r["times"]["extract"], r["times"]["bare"],
                                                      strict=True)) / r["n"] * 1e3
        for r in results)
    loads = [x for r in results for x in r["load"]]
    return {"bare": bare, "extract": extract, "ratio": ratio, "of_medians": extract / bare,
            "cpu_ms": outside,
            "load_min": min(loads), "load_max": max(loads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another tree to measure beside this one")
    parser.add_argument("--models", default="vit-b,dinov2-l-reg,dinov2-518,roberta")
    parser.add_argument("--images", type=int, default=None,
                        help="inputs per model (default: 128; 16 for dinov2-518)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in each process")
    parser.add_argument("--repeats", type=int, default=2, help="processes per tree and model")
    parser.add_argument("--rewrite", action="store_true",
                        help="each round replaces the last round's chunk files (default: "
                             "new files, as a sweep writes them)")
    parser.add_argument("--simulate", action="store_true",
                        help="a simulated device on this tree instead")
    parser.add_argument("--factors", default="0,0.25,0.5,1,2,4",
                        help="--simulate: t as multiples of the CPU work per batch")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = {"after": ROOT} if args.before is None or args.simulate else \
        {"before": args.before.resolve(), "after": ROOT}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        kept: list[Path] = []  # finished processes' stores: deleted at the end, or to make room
        count = max(DEFAULT_INPUTS.values()) if args.images is None else args.images
        images = make_images(folder / "images", count)
        print(f"pipeline_bench: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
              f"trees {', '.join(f'{k}={v}' for k, v in trees.items())}", flush=True)
        for name in args.models.split(","):
            path, options = thin_model(folder / "models", name)
            n = args.images or DEFAULT_INPUTS[name]
            spec = {"config": sweep_config(folder, path, options, name, n, BATCH[name], images),
                    "scratch": scratch, "rounds": args.rounds, "rewrite": args.rewrite}
            if args.simulate:
                factors = [float(f) for f in args.factors.split(",")]
                report_simulation(name, run_child(ROOT, spec | {"simulate": True,
                                                                  "factors": factors}, kept))
                continue
            results: dict[str, list[dict]] = {tree: [] for tree in trees}
            for _ in range(args.repeats):
                for tree, where in trees.items():
                    results[tree].append(run_child(where, spec, kept))
            report(name, n, BATCH[name], {tree: summary(r) for tree, r in results.items()})


def report(name: str, n: int, batch: int, rows: dict[str, dict]) -> None:
    print(f"\n{name}: {n} inputs, batch {batch}")
    print(f"  {'tree':<7} {'bare /s':>9} {'extract /s':>11} {'ratio':>6} {'of medians':>11} "
          f"{'CPU ms/input outside forward':>29} {'load':>9}")
    for tree, row in rows.items():
        print(f"  {tree:<7} {row['bare']:>9.1f} {row['extract']:>11.1f} {row['ratio']:>6.2f} "
              f"{row['of_medians']:>11.2f} {row['cpu_ms']:>29.2f} "
              f"{row['load_min']:>4.1f}-{row['load_max']:<4.1f}")
    if "before" in rows:
        print(f"  CPU ms outside the forward pass: before / after = "
              f"{rows['before']['cpu_ms'] / rows['after']['cpu_ms']:.2f}x", flush=True)


def report_simulation(name: str, out: dict) -> None:
    cores = len(os.sched_getaffinity(0))
    work = out["work_s"]
    print(f"\n{name} on a simulated device: {out['batches']} batches, CPU work {1e3 * work:.1f} "
          f"ms per batch, {cores} cores, load {out['load']:.1f}")
    print(f"  {'t (ms)':>8} {'batches/s':>10} {'1/max(t, W/cores)':>18} {'measured/bound':>15}")
    for point in out["points"]:
        bound = 1.0 / max(point["t_s"], work / cores)
        got = 1.0 / point["wall_s"]
        print(f"  {1e3 * point['t_s']:>8.1f} {got:>10.2f} {bound:>18.2f} {got / bound:>15.2f}",
              flush=True)


if __name__ == "__main__":
    main()
