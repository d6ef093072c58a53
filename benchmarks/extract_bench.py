"""Extraction throughput (inputs/s) against the bare forward pass of the same model, one run.

All paths preprocess the same inputs with the same batch size. "bare (eager)" runs the model as
extraction builds it (eager / unfused attention) without hooks; "bare (fused)" runs it as it is
normally run (transformers sdpa, timm fused attention; FT-Transformer has no such variant);
"extraction" adds the hooks, per-layer head averaging, cropping and copying to numpy. Rounds
alternate between the paths so machine noise hits all alike; the median round is reported.

    PYTHONPATH=. python benchmarks/extract_bench.py tiny-vit sklearn:sample_images --n 14
    PYTHONPATH=. python benchmarks/extract_bench.py vit-base-16 sklearn:sample_images --random-init
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from workers.inputs import DatasetSpec, infer_kind, open_dataset
from workers.models.extraction import Extractor, load_extractor, prepare_model
from workers.models.registry import resolve_model


@contextmanager
def fused_attention(ex: Extractor) -> Iterator[None]:
    """Within the block the model runs its fast attention kernel; eager attention is restored."""
    if ex.spec.family == "timm":
        for block in ex.model.blocks:
            block.attn.fused_attn = True
    elif ex.spec.family == "hf":
        ex.model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        if ex.spec.family == "timm":
            for block in ex.model.blocks:
                block.attn.fused_attn = False
        elif ex.spec.family == "hf":
            ex.model.set_attn_implementation("eager")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument("--n", type=int, default=16, help="inputs per round")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--random-init", action="store_true",
                        help="timm: same architecture, random weights (no download)")
    args = parser.parse_args()

    source = {"source": args.inputs} if ":" in args.inputs else {"path": args.inputs}
    dataset = open_dataset(DatasetSpec(kind=infer_kind(args.inputs), limit=args.n, **source))
    spec = resolve_model(args.model)
    if args.random_init:
        spec = dataclasses.replace(spec, pretrained=False)
    with tempfile.TemporaryDirectory() as cache:
        prepare_model(spec, dataset, cache)
        ex = load_extractor(spec, dataset=dataset, device=args.device, dtype=args.dtype,
                            cache_dir=cache)
    batches = [range(i, min(i + args.batch_size, len(dataset)))
               for i in range(0, len(dataset), args.batch_size)]
    items = [dataset.load(b) for b in batches]
    ids = [[dataset.ids[i] for i in b] for b in batches]

    def sync() -> None:
        if ex.device.type == "cuda":
            torch.cuda.synchronize(ex.device)

    def bare() -> None:
        with torch.inference_mode():
            for chunk in items:
                ex.forward(ex.prepare(chunk))
        sync()

    def extract() -> None:
        for chunk, chunk_ids in zip(items, ids, strict=True):
            ex.extract(chunk, chunk_ids)
        sync()

    def fused() -> None:
        with fused_attention(ex):
            bare()

    paths = {"bare (eager)": bare, "bare (fused)": fused, "extraction": extract}
    if ex.spec.family == "ft-transformer":
        del paths["bare (fused)"]
    for fn in paths.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    rate = {name: len(dataset) / statistics.median(t) for name, t in times.items()}
    print(f"model {args.model} on {args.inputs}: {len(dataset)} inputs, batch {args.batch_size}, "
          f"device {ex.device}, dtype {args.dtype}, {args.rounds} rounds (median)")
    for name, value in rate.items():
        print(f"  {name:13s} {value:9.2f} inputs/s")
    for name in paths:
        if name != "extraction":
            print(f"  extraction / {name} = {rate['extraction'] / rate[name]:.3f}")


if __name__ == "__main__":
    main()
