"""An image batch's load stage, PIL's path against the tensor path (`Dataset.load` against
`Dataset.load_pixels`, issue 41): per input, the CPU ms of reading and decoding, and of the model's
own image processor (`Extractor.prepare`), in one process, the same 500 x 375 JPEGs and thin ViT-B
as `pipeline_bench.py`; best of `--rounds`, each path timed after a warm-up. The tensors go
through the processor twice: as it takes them itself (a channel-first copy of each before its
resize) and as the extractor gives them (`workers.models.hf.keep_layout`: resized as decoded).

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
        layout = extractor.layout_processor
        paths = (("load (PIL images)", dataset.load, layout),
                 ("load_pixels, copied", dataset.load_pixels, None),
                 ("load_pixels, as decoded", dataset.load_pixels, layout))
        for name, read, processor in paths:
            extractor.layout_processor = processor  # None: the processor's own path
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
            print(f"  {name:<24} read and decode {read_ms:5.2f} ms, processor {prepare_ms:5.2f} "
                  f"ms, together {read_ms + prepare_ms:5.2f} CPU ms per input")


if __name__ == "__main__":
    main()
