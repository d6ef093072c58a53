"""`sweep extract MODEL_SOURCE INPUTS --out FILE.npz`: attention of a few inputs, no store.

The npz holds no objects: `ids` (unicode array), and per input k `attention_<k>`
(layer, T, T) float32 (head-averaged; with `--heads each`, (layer, head, T, T)) and
`token_kind_<k>` (T,) int8.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from storage.errors import InputError
from sweep.cli.outputs import check_writable_folder, npz_path
from sweep.config.schema import check_device_name
from sweep.driver.devices import check_device
from workers.inputs import KINDS, DatasetSpec, infer_kind, open_dataset
from workers.models.extraction import DTYPES, load_extractor, model_dataset, prepare_model
from workers.models.registry import (
    HEADS_MODES,
    PRESETS,
    SOURCE_FORMS,
    TRAINED_FAMILIES,
    resolve_model,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        description=__doc__,
    )
    parser.add_argument("model", metavar="MODEL_SOURCE", help=source_help())
    parser.add_argument("inputs", metavar="INPUTS",
                        help="image folder, .txt, .csv, sklearn:<name>, pydoc:topics, hf:<dataset>")
    parser.add_argument("--out", required=True, type=Path,
                        help="output .npz file (.npz is appended when missing)")
    parser.add_argument("--kind", choices=KINDS, help="input kind (inferred when obvious)")
    parser.add_argument("--limit", type=int, help="first N inputs only")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda:0")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--target", default="target", help="CSV target column (tabular)")
    parser.add_argument("--weights", help="local .safetensors weights (timm sources)")
    parser.add_argument("--cache-dir", type=Path,
                        help="where models trained here keep their weights")
    parser.add_argument("--image-size", type=int, metavar="N",
                        help="image models: resize and crop inputs to N pixels")
    parser.add_argument("--heads", choices=HEADS_MODES, default="mean",
                        help="mean: head-averaged attention (default); each: every head's")
    parser.add_argument("--random-init", action="store_true",
                        help="the model's random-init control: same architecture and "
                        "preprocessing, seeded random weights")
    parser.set_defaults(func=run)


def source_help() -> str:
    """MODEL_SOURCE's help from the registry: the source forms, then every preset (those trained
    here by name), so a new preset or recipe is listed without an edit here."""
    trained = [name for name, spec in PRESETS.items() if spec.family in TRAINED_FAMILIES]
    return (f"{', '.join(SOURCE_FORMS[1:3])}, or a preset: trained here (first, then cached) "
            f"{', '.join(trained)}; {', '.join(n for n in PRESETS if n not in trained)}")


def run(args: argparse.Namespace) -> int:
    target = npz_path(args.out)  # numpy.savez appends .npz: report the path really written
    if target.is_dir():
        raise InputError(f"--out {args.out}: {target} is a folder; give a file path ending .npz")
    check_writable_folder(target.parent, "--out folder")
    kind = args.kind or infer_kind(args.inputs)
    if kind is None:
        raise InputError(f"cannot tell the kind of inputs {args.inputs!r}: pass --kind {KINDS}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size {args.batch_size}: must be at least 1")
    is_source = ":" in args.inputs and not Path(args.inputs).exists()
    spec = DatasetSpec(
        kind=kind, limit=args.limit, target=args.target,
        **({"source": args.inputs} if is_source else {"path": args.inputs}),
    )
    dataset = open_dataset(spec)
    options = {"weights": args.weights, "image_size": args.image_size}
    model = resolve_model(args.model, random_init=args.random_init, heads=args.heads,
                          **{key: value for key, value in options.items() if value is not None})
    if model.modality != kind:
        raise InputError(f"model {args.model!r} takes {model.modality} inputs, not {kind}")
    try:
        check_device_name(args.device)
    except ValueError as error:
        raise InputError(f"--device {error}") from None
    check_device(args.device, "--device")
    prepare_model(model, dataset, args.cache_dir)
    extractor = load_extractor(model, dataset=dataset, device=args.device, dtype=args.dtype,
                               cache_dir=args.cache_dir)
    dataset = model_dataset(model, dataset)  # FT-Transformer: its test rows by default
    arrays: dict[str, np.ndarray] = {"ids": np.array(dataset.ids, dtype=str)}
    start = time.perf_counter()
    for first in range(0, len(dataset), args.batch_size):
        indices = range(first, min(first + args.batch_size, len(dataset)))
        outs = extractor.extract(dataset.load(indices), [dataset.ids[i] for i in indices])
        for k, out in zip(indices, outs, strict=True):
            arrays[f"attention_{k}"] = out.attention
            arrays[f"token_kind_{k}"] = out.token_kind
    seconds = time.perf_counter() - start
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez(target, **arrays)
    print(f"{target}: {len(dataset)} inputs, {extractor.n_layers} layers, {seconds:.1f} s",
          file=sys.stderr)
    return 0
