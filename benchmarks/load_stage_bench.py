"""An image batch's load stage, PIL's path against the tensor path (`Dataset.load` against
`Dataset.load_pixels`, issue 41): per input, the CPU ms of reading and decoding, and of the model's
own image processor (`Extractor.prepare`), in one process, the same 500 x 375 JPEGs and thin ViT-B
as `pipeline_bench.py`; best of `--rounds`, each path timed after a warm-up. The tensors go
through the processor twice: as it takes them itself (a channel-first copy of each before its
resize) and as the extractor gives them (`workers.models.hf.keep_layout`: resized as decoded).

A text batch's load stage too (the thin RoBERTa of `pipeline_bench.py` on pydoc's topics, one
batch of `--images` texts): `Extractor.prepare` (the tokenizer's numpy arrays, kinds by numpy)
against the same from the tokenizer's torch tensors with the kinds token by token (the code
before 2026-12-07, kept here as the baseline), checked equal; CPU ms per input, best of rounds.

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
        text(folder, args.images, args.rounds)


def text(folder: Path, n: int, rounds: int) -> None:
    """The text load stage: the extractor's `prepare` against the torch-tensor baseline."""
    import torch

    from workers.tasks.cache import cached_dataset

    path, options = pipeline_bench.thin_model(folder / "models", "roberta")
    (folder / "text").mkdir()
    config = pipeline_bench.sweep_config(folder / "text", path, options, "roberta", n, n, None)
    measured = pipeline_bench.Measured(config, str(folder / "text"))
    extractor = measured.extractor
    items = cached_dataset(measured.tasks[0].dataset).load(range(n))
    ours, theirs = extractor.prepare(items), torch_tensors_prepare(extractor, items)
    assert all(torch.equal(ours.inputs[k], theirs.inputs[k]) for k in theirs.inputs)
    assert all(a.tolist() == b.tolist() for a, b in zip(ours.token_kinds, theirs.token_kinds,
                                                        strict=True))
    print(f"{n} texts, {type(extractor.tokenizer).__name__}")
    for name, prepare in (("tokenizer's torch tensors", lambda: torch_tensors_prepare(
            extractor, items)), ("prepare (numpy arrays)", lambda: extractor.prepare(items))):
        prepare()  # warm-up
        best = float("inf")
        for _ in range(rounds):
            start = time.process_time()
            prepare()
            best = min(best, time.process_time() - start)
        print(f"  {name:<26} {1e3 * best / n:5.3f} CPU ms per input")


def torch_tensors_prepare(extractor, items):
    """A text batch as `HFExtractor.prepare` made it before 2026-12-07: the tokenizer's torch
    tensors, each token's kind in a Python loop."""
    import numpy as np

    from workers.exact.token_kinds import TokenKind
    from workers.models.extraction import Batch

    encoded = extractor._tokenize(items, padding=True, return_tensors="pt")
    special = encoded.pop("special_tokens_mask")
    positions = [row.nonzero().flatten() for row in encoded["attention_mask"]]
    cls = extractor.tokenizer.cls_token_id
    cls = extractor.tokenizer.bos_token_id if cls is None else cls
    kinds = [np.array([TokenKind.CONTENT if not s else TokenKind.CLS if i == cls
                       else TokenKind.SEP for i, s in zip(encoded["input_ids"][b, p].tolist(),
                                                          special[b, p].tolist(), strict=True)],
                      dtype=np.int8) for b, p in enumerate(positions)]
    inputs = {k: v for k, v in encoded.items() if k in extractor.input_names}
    return Batch(inputs, positions, kinds)


if __name__ == "__main__":
    main()
