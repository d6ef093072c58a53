"""An image batch's load stage, PIL's path against the tensor path (`Dataset.load` against
`Dataset.load_pixels`, issue 41): per input, the CPU ms of reading and decoding, and of the model's
own image processor, in one process, the same 500 x 375 JPEGs as `pipeline_bench.py` through the
thin ViT-B's processor (`--model vit-b`) or DINOv2's (`--model dinov2-l-reg`: shortest edge 256,
bicubic, a crop to 224). Each path prepares into one kept batch buffer, as a pipeline's part
does; rounds interleave the paths, after a warm-up of each; best and median of `--rounds`. The
tensors go through the processor three ways: as it takes them itself (a channel-first copy of
each before its resize); resized as decoded and made channel-first after the resize, each
picture rescaled and normalised in a tensor of its own and then copied into the batch (the
extractor's route before 2026-12-07's eighth session, kept here as the baseline); and as the
extractor gives them now (`workers.models.image_processing`: resized as decoded, converted to
float32 into the batch's rows, normalised there). All give the same values (checked).

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
    parser.add_argument("--model", default="vit-b", choices=("vit-b", "dinov2-l-reg"))
    parser.add_argument("--no-text", action="store_true", help="images only")
    args = parser.parse_args()
    from workers.tasks.cache import cached_dataset

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        images = pipeline_bench.make_images(folder / "images", args.images)
        path, options = pipeline_bench.thin_model(folder / "models", args.model)
        config = pipeline_bench.sweep_config(folder, path, options, args.model, args.images,
                                             args.images, images)
        measured = pipeline_bench.Measured(config, scratch)
        extractor, dataset = measured.extractor, cached_dataset(measured.tasks[0].dataset)
        print(f"{args.images} inputs, {type(dataset).__name__}, "
              f"{type(extractor.processor).__name__} ({extractor.processor.backend} backend)")
        pictures(extractor, dataset, args.images, args.rounds)
        if not args.no_text:
            text(folder, args.images, args.rounds)


def pictures(extractor, dataset, n: int, rounds: int) -> None:
    """The image paths, interleaved round by round; CPU ms per input, best and median."""
    import statistics

    import torch

    from workers.models.extraction import stack_into

    everything, layout = range(n), extractor.layout_processor
    reference = extractor.prepare(dataset.load(everything)).inputs["pixel_values"]
    out = torch.empty_like(reference)
    apart = normalised_apart(extractor.processor)

    def own(items):  # the processor's own route: no layout processor
        extractor.layout_processor = None
        try:
            return extractor.prepare_into(items, {"pixel_values": out}).inputs["pixel_values"]
        finally:
            extractor.layout_processor = layout

    paths = {
        "load (PIL images)": (dataset.load, own),
        "load_pixels, copied": (dataset.load_pixels, own),
        "as decoded, normalised apart": (dataset.load_pixels, lambda items: stack_into(
            apart(images=list(items), return_tensors=None,
                  **extractor.processor_kwargs)["pixel_values"], out)),
        "as decoded, normalised in rows": (dataset.load_pixels, lambda items: (
            extractor.prepare_into(items, {"pixel_values": out}).inputs["pixel_values"])),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    for name, (read, prepare) in paths.items():  # warm-up, and the values checked
        assert torch.equal(prepare(read(everything)), reference), name
    for _ in range(rounds):
        for name, (read, prepare) in paths.items():
            start = time.process_time()
            items = read(everything)
            middle = time.process_time()
            prepare(items)
            times[name].append((middle - start, time.process_time() - middle))
    for name, rows in times.items():
        best = min(rows, key=sum)
        median = statistics.median(sum(row) for row in rows)
        read_ms, prepare_ms = (1e3 * t / n for t in best)
        print(f"  {name:<31} best: read and decode {read_ms:5.2f} ms, processor "
              f"{prepare_ms:5.2f} ms, together {read_ms + prepare_ms:5.2f}; median together "
              f"{1e3 * median / n:5.2f} CPU ms per input")


def normalised_apart(processor):
    """The extractor's layout processor before 2026-12-07's eighth session (the baseline): a
    decoder's picture taken as it lies, made channel-first after the resize, then rescaled and
    normalised by the processor in a tensor of its own."""
    import copy

    from workers.models.image_processing import layout_kept

    kept = copy.copy(processor)
    own_process, own_resize = kept.process_image, kept.resize

    def process_image(image, *args, **kwargs):
        if layout_kept(image) and kwargs.get("device") is None \
                and kwargs.get("input_data_format") in (None, "channels_first"):
            return image
        return own_process(image, *args, **kwargs)

    def resize(image, *args, **kwargs):
        return own_resize(image, *args, **kwargs).contiguous()

    kept.process_image, kept.resize = process_image, resize
    return kept


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
