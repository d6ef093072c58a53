"""An image batch's load stage, PIL's path against the tensor path (`Dataset.load` against
`Dataset.load_pixels`, issue 41): per input, the CPU ms of reading and decoding, and of the model's
own image processor (`Extractor.prepare`), in one process, the same 500 x 375 JPEGs and thin ViT-B
as `pipeline_bench.py`; best of `--rounds`, each path timed after a warm-up. Then the copy into
the processor's channel-first layout, by torch (the processor's own) and by numpy (ours).

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/load_stage_bench.py [--images 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline_bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from workers.tasks.cache import cached_dataset

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        images = pipeline_bench.make_images(folder / "images", args.images)
        path, options = pipeline_bench.thin_model(folder / "models", "vit-b")
        config = pipeline_bench.sweep_config(folder, path, options, "vit-b", args.images,
                                             args.images, images)
        measured = pipeline_bench.Measured(config, scratch)
        extractor, dataset = measured.extractor, cached_dataset(measured.tasks[0].dataset)
        print(f"{args.images} inputs, {type(dataset).__name__}, "
              f"{type(extractor.processor).__name__} ({extractor.processor.backend} backend)")
        everything = range(args.images)
        for name, read in (("load (PIL images)", dataset.load),
                           ("load_pixels (tensors)", dataset.load_pixels)):
            extractor.prepare(read(everything))  # warm-up
            best = (float("inf"), float("inf"))
            for _ in range(args.rounds):
                start = time.process_time()
                items = read(everything)
                middle = time.process_time()
                extractor.prepare(items)
                best = min(best, (middle - start, time.process_time() - middle),
                           key=sum)
            read_ms, prepare_ms = (1e3 * t / args.images for t in best)
            print(f"  {name:<22} read and decode {read_ms:5.2f} ms, processor {prepare_ms:5.2f} "
                  f"ms, together {read_ms + prepare_ms:5.2f} CPU ms per input")
        channel_first_copies(dataset.load(everything), args.rounds)


def channel_first_copies(images: list, rounds: int) -> None:
    """CPU ms per picture of the copy of an RGB decode (row, column, channel) into the layout the
    processor keeps (channel, row, column, contiguous): torch's `.contiguous()` of the permuted
    view, as the processor makes it, and numpy's transpose (`workers.inputs.pixels`); best of
    `rounds`."""
    import numpy as np
    import torch

    from workers.inputs.pixels import channels_first

    decoded = [np.array(image) for image in images]
    views = [torch.from_numpy(array).permute(2, 0, 1) for array in decoded]
    for name, copy in (("torch .contiguous()", lambda: [v.contiguous() for v in views]),
                       ("numpy transpose", lambda: [channels_first(v.numpy()) for v in views])):
        copy()  # warm-up
        best = float("inf")
        for _ in range(rounds):
            start = time.process_time()
            copy()
            best = min(best, time.process_time() - start)
        print(f"  channel-first copy, {name:<20} {1e3 * best / len(images):5.2f} CPU ms per "
              f"picture")


if __name__ == "__main__":
    main()
