"""The GPU check behind `benchmarks/gpu_check.sh`: on a CUDA machine, in under 5 minutes,

1. extraction on CUDA: tiny presets and a randomly initialised ViT-B/16 (timm, full size), with
   throughput (inputs/s) and sanity checks (one map per layer, rows stochastic, finite);
2. `check(device="cuda")` against the CPU kernel on the extracted stacks and on attention-like
   stacks: identical verdicts, kappa, kappa(M), margins and pairs (the float64 verification is
   shared; only the screen differs);
3. the rollout on the device (`rollout_device: extraction`, `workers.exact.device_rollout`)
   against the CPU path (`workers.exact.equality.rollout`) on the extracted stacks and on
   attention-like stacks (at T = 197 and 1370 on a GPU): every layer's rollout kappa within
   `kappa_bound`, both timed;
4. a short sweep on the local cluster with a GPU pool (extraction on the GPU worker, tests on
   CPU workers), its stored results equal to the test stage rerun here on its stored attention,
   with throughput;
5. the extraction pipeline (issue 41) against the bare eager forward pass on 1,024 images of
   500 x 375 at batch 64, random-init ViT-B/16 and DINOv2-B at 224 px, with the attention
   bytes per second the store took.

`--dry-run` runs the same steps on the CPU with tiny sizes (torch's cdist screen on "cpu", a
thread pool standing for the GPU pool) in well under a minute: what CI runs. Exit code 1 and a
line naming the step when a check fails.

    python benchmarks/gpu_check.py [--dry-run]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sweep.clusters.client import load_cluster_config, open_client
from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import execute_plan, locked, materialise
from workers.exact.device_rollout import kappa_bound, restricted_rollout_kappa
from workers.exact.equality import check, restrict_layers, rollout
from workers.exact.token_kinds import keep_mask, special_mask
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor
from workers.models.registry import ModelSpec, resolve_model
from workers.tasks.verdicts import evaluate_shard

RESULT_FIELDS = ("kappa", "kappa_factor", "bound", "margin", "holds", "holds_by_characterisation",
                 "pair", "attaining_pairs", "attaining_special")
VIT_B_RANDOM = ModelSpec("vit-b-random", "timm", "vit_base_patch16_224", "image",
                         pretrained=False)


class CheckFailed(Exception):
    """A step's check failed (message: what differs)."""


def say(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)


def extraction(device: str, models: list[ModelSpec], n: int) -> dict[str, list[np.ndarray]]:
    """Extract `n` inputs per model on `device`; print throughput; return float64 stacks."""
    images = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=n))
    texts = open_dataset(DatasetSpec(kind="text", source="pydoc:topics", limit=n))
    stacks = {}
    for spec in models:
        data = images if spec.modality == "image" else texts
        extractor = load_extractor(spec, device=device)
        items = data.load(range(len(data)))
        extractor.extract(items[:1], data.ids[:1])  # warm-up (kernels, caches)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        outs = extractor.extract(items, data.ids)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        for out in outs:
            rows = out.attention.astype(np.float64).sum(axis=-1)
            if out.attention.shape[0] != extractor.n_layers or not np.isfinite(rows).all() \
                    or np.abs(rows - 1).max() > 1e-3:
                raise CheckFailed(f"extraction of {spec.name} on {device}: bad maps for "
                                  f"{out.input_id} (shape {out.attention.shape})")
        tokens = outs[0].attention.shape[-1]
        say(f"extract {spec.name:<14} on {device}: {len(outs)} inputs x {extractor.n_layers} "
            f"layers x T={tokens}: {len(outs) / seconds:.1f} inputs/s")
        stacks[spec.name] = [(out.attention, out.token_kind) for out in outs]
    return stacks


def attention_like(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    logits = 2.0 * rng.normal(size=(layers, t, t))
    logits[:, :, 0] += 4.0
    logits[:, np.arange(t), np.arange(t)] += 2.0
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


def same_results(stack: np.ndarray, special: np.ndarray, device: str, what: str) -> float:
    """check(device=...) == check() on the CPU, field for field; returns the device's seconds."""
    cpu = check(stack, special=special, validate=False)
    start = time.perf_counter()
    dev = check(stack, special=special, validate=False, device=device)
    seconds = time.perf_counter() - start
    for field in RESULT_FIELDS:
        if not np.array_equal(getattr(cpu, field), getattr(dev, field)):
            raise CheckFailed(f"check(device={device!r}) differs from the CPU kernel on {what}: "
                              f"{field}")
    return seconds


def kernels(device: str, stacks: dict, t: int, layers: int) -> None:
    """The torch screen on `device` against the CPU kernel: extracted and attention-like stacks."""
    matrices = 0
    for name, items in stacks.items():
        for attention, kinds in items:
            for token_set in ("all", "content"):
                keep = keep_mask(kinds, token_set)
                if keep.sum() < 2:
                    continue
                stack, kept, ok = restrict_layers(attention, keep)
                same_results(stack, special_mask(kinds)[kept], device, f"{name} {token_set}")
                matrices += len(stack)
    rng = np.random.default_rng(0)
    stack = np.ascontiguousarray(attention_like(rng, layers, t))
    seconds = same_results(stack, np.zeros(t, dtype=bool), device, f"attention-like T={t}")
    identity = np.eye(t)[None]
    same_results(identity, np.zeros(t, dtype=bool), device, "the identity (every pair ties)")
    say(f"check(device={device!r}) == CPU kernel on {matrices} extracted matrices, "
        f"{layers} attention-like at T={t} and the identity; {layers / seconds:.1f} matrices/s "
        f"at T={t} on {device}")


def same_rollout(attention: np.ndarray, keep: np.ndarray, device: str,
                 what: str) -> tuple[float, float, float]:
    """The rollout kappa on `device` (restriction included) against the CPU path (restriction,
    products, kappa), layer by layer within kappa_bound; returns (CPU seconds, device seconds,
    the largest difference / bound)."""
    start = time.perf_counter()
    stack, _, _ = restrict_layers(attention, keep)
    cpu, _ = rollout(stack, validate=False)
    cpu_s = time.perf_counter() - start
    start = time.perf_counter()
    dev = restricted_rollout_kappa(attention, keep, device)  # its .cpu() waits for the device
    dev_s = time.perf_counter() - start
    t = attention.shape[-1]
    bound = np.array([kappa_bound(layer, t) for layer in range(1, len(attention) + 1)])
    ratio = float(np.max(np.abs(dev - cpu) / bound))
    if not ratio <= 1.0:
        raise CheckFailed(f"the rollout on {device} differs from the CPU path on {what} by "
                          f"{ratio:.3g} x its bound")
    return cpu_s, dev_s, ratio


def rollouts(device: str, stacks: dict, sizes: list[int], layers: int) -> None:
    """The rollout's kappa on `device` against the CPU path: extracted and attention-like stacks."""
    worst = 0.0
    for name, items in stacks.items():
        for attention, kinds in items:
            for token_set in ("all", "content"):
                keep = keep_mask(kinds, token_set)
                if keep.sum() >= 2 and restrict_layers(attention, keep)[2].all():
                    worst = max(worst, same_rollout(attention, keep, device,
                                                    f"{name} {token_set}")[2])
    rng = np.random.default_rng(1)
    for t in sizes:
        attention = attention_like(rng, layers, t).astype(np.float32)
        keep = np.arange(t) > 0  # CLS dropped: `content`
        same_rollout(attention[:2], keep, device, "warm-up")  # kernels, allocator, caches
        cpu_s, dev_s, ratio = same_rollout(attention, keep, device, f"attention-like T={t}")
        worst = max(worst, ratio)
        say(f"rollout on {device} at T={t}, {layers} layers: {1e3 * dev_s:.1f} ms against "
            f"{1e3 * cpu_s:.1f} ms on the CPU path ({cpu_s / dev_s:.1f}x)")
    say(f"rollout on {device} within kappa_bound of the CPU path on every stack (largest "
        f"difference {worst:.2g} of the bound)")


def write_sweep(folder: Path, device: str, n: int, models: list[str]) -> tuple[Path, Path]:
    """A sweep config (tiny models, `n` inputs each) and a local cluster with a GPU pool."""
    config = folder / "sweep.yaml"
    lines = [f"store: {folder / 'store.zarr'}", "shard_size: 4", f"device: {device}",
             "datasets:",
             f"  photos: {{source: 'sklearn:sample_images', limit: {n}}}",
             f"  topics: {{source: 'pydoc:topics', limit: {n}}}",
             "models:"]
    for name in models:
        dataset = "photos" if resolve_model(name).modality == "image" else "topics"
        lines.append(f"  {name}: {{source: {name}, dataset: {dataset}}}")
    config.write_text("\n".join(lines) + "\n")
    cluster = folder / "cluster.yaml"
    if device == "cpu":  # dry run: a thread pool stands for the GPU pool
        cluster.write_text(
            "kind: local\ndashboard_address: ':0'\nlocal:\n  processes: false\n  pools:\n"
            "    gpu: {workers: 1, threads: 1, resources: {GPU: 1}}\n"
            "    cpu: {workers: 1, threads: 1, resources: {CPU: 1}}\n")
    else:  # the machine-sized default: one GPU worker per device, CPU workers on the rest
        cluster.write_text("kind: local\ndashboard_address: ':0'\nlocal: {gpus: auto}\n")
    return config, cluster


def recomputed(store: Path, model: str) -> tuple[dict, dict]:
    """The stored results of `model` and the test stage recomputed here from its stored
    attention (the GPU's forward passes differ from the CPU's, so the attention is the input)."""
    import zarr

    group = zarr.open_group(str(store), mode="r")[model]
    stored = {name: np.asarray(array[:]) for name, array in group["results"].arrays()}
    again = evaluate_shard(np.asarray(group["attention"][:]), np.asarray(group["n_tokens"][:]),
                           np.asarray(group["token_kind"][:]), tuple(group.attrs["token_sets"]),
                           1e-12)
    return stored, again


def sweep(device: str, n: int, models: list[str]) -> None:
    """A short sweep with a GPU pool; its results equal the test stage rerun here on its store."""
    with tempfile.TemporaryDirectory() as tmp:
        config_path, cluster_path = write_sweep(Path(tmp), device, n, models)
        config = load_config(config_path)
        start = time.perf_counter()
        with locked(config), open_client(load_cluster_config(cluster_path),
                                         out=sys.stdout) as client:
            summary = execute_plan(materialise(config), DaskExecutor(client), progress=False)
        seconds = time.perf_counter() - start
        if summary.exit_code:
            raise CheckFailed("sweep with a GPU pool: " + "; ".join(summary.lines()))
        for model in models:
            stored, again = recomputed(config.store, model)
            if not (stored["status"] == 0).all():
                raise CheckFailed(f"sweep on {device}: {model} has results not computed")
            for name, values in again.items():
                if not np.array_equal(values, stored[name], equal_nan=values.dtype.kind == "f"):
                    raise CheckFailed(f"sweep on {device}: {model} {name} differs from the "
                                      f"test stage rerun on the CPU")
        say(f"sweep with a GPU pool ({device}): {len(models)} models x {n} inputs in "
            f"{seconds:.1f} s ({len(models) * n / seconds:.2f} inputs/s, cluster start-up "
            f"included); stored results equal the test stage rerun here")


def pipeline(device: str, n: int, batch: int, shard: int) -> None:
    """Extraction as a sweep runs it (`run_task` on every shard, in process) against the bare
    eager forward pass on the same batches, preprocessed beforehand, on `n` images of 500 x 375
    (benchmarks/pipeline_bench.py): random-init ViT-B/16 and DINOv2-B at 224 px (on a dry run
    a thin model of ViT-B's shape); inputs/s of both, their ratio, the attention bytes/s."""
    from transformers import Dinov2Config, ViTConfig, ViTImageProcessor

    from benchmarks.pipeline_bench import (
        Measured,
        dinov2_processor,
        make_images,
        save_hf_model,
        sweep_config,
    )

    dry = device == "cpu"
    models = {"vit-b-16": (ViTConfig(), ViTImageProcessor(), {}),
              "dinov2-b": (Dinov2Config(image_size=518), dinov2_processor(), {"image_size": 224})}
    if dry:
        models = {"thin-vit-b": (ViTConfig(hidden_size=16, num_attention_heads=1,
                                           intermediate_size=32), ViTImageProcessor(), {})}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        images = make_images(folder / "images", n)
        for name, (config, processor, options) in models.items():
            path = save_hf_model(folder / "models", name, config, processor)
            measured = Measured(sweep_config(folder, path, options, name, n, batch, images,
                                             shard=shard, device=device), tmp)
            times = measured.rounds(2)
            bare = n / min(t[0] for t in times["bare"])
            extract = n / min(t[0] for t in times["extract"])
            say(f"pipeline {name} on {device}: {n} images, batch {batch}, shards of {shard}: "
                f"extraction {extract:.1f} inputs/s, bare eager forward {bare:.1f} inputs/s "
                f"(extraction / bare = {extract / bare:.2f}; issue 41's target on a GPU: 0.8); "
                f"attention written {extract * measured.input_bytes / 1e9:.3f} GB/s "
                f"({measured.input_bytes / 1e6:.2f} MB per input)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the same steps on the CPU with tiny sizes (CI)")
    args = parser.parse_args(argv)
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        say("no CUDA device (torch.cuda.is_available() is False); use --dry-run on a CPU")
        return 2
    device = "cpu" if dry else "cuda"
    say(f"{'dry run on the CPU' if dry else torch.cuda.get_device_name(0)}; torch "
        f"{torch.__version__}")
    tiny = ["tiny-vit", "tiny-dinov2-reg", "tiny-roberta"]
    models = [resolve_model(name) for name in tiny] + ([] if dry else [VIT_B_RANDOM])
    start = time.perf_counter()
    try:
        stacks = extraction(device, models, n=2 if dry else 16)
        kernels(device, stacks, t=33 if dry else 197, layers=4 if dry else 12)
        rollouts(device, stacks, sizes=[33] if dry else [197, 1370], layers=4 if dry else 12)
        sweep(device, n=2 if dry else 16, models=tiny[:2] if dry else tiny)
        pipeline(device, n=8 if dry else 1024, batch=4 if dry else 64, shard=8 if dry else 512)
    except CheckFailed as error:
        say(f"FAILED: {error}")
        return 1
    say(f"all checks passed in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
