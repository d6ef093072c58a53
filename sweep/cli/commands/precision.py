"""`sweep precision STORE --dtype bfloat16 [--sample N] [--model NAME ...]`: re-extract a sample
of a store's inputs at a lower dtype and count the verdicts that flip, beside the verdicts the
precision table calls undecided at that dtype (`sweep.report.precision_flips`). Offline: the models
load their local weights (or the store's FT-Transformer checkpoints), never the hub."""

from __future__ import annotations

import argparse
import json
import os
import sys

from storage.errors import InputError
from sweep.cli.commands.report import check_readable
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.cli.outputs import add_format_argument
from sweep.report.precision import UNIT_ROUNDOFF

DEFAULT_SAMPLE = 32


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `precision` subcommand."""
    parser = subparsers.add_parser("precision", description=__doc__)
    add_store_argument(parser)
    parser.add_argument("--dtype", required=True, choices=sorted(UNIT_ROUNDOFF),
                        help="the dtype to re-extract in (the store's own dtype: a "
                        "reproducibility check that must flip nothing)")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"inputs per model (default {DEFAULT_SAMPLE}; at least the "
                        "model's inputs: all of them), the same ids for a model and its control")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="which inputs the sample takes (default 0)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="a model of the store (repeatable; default: every model)")
    parser.add_argument("--device", help="re-extract on this device (default: the device "
                        "kind the store pinned for the model, else cpu)")
    add_format_argument(parser, ("text", "json"), help="text: the flips table in Markdown "
                        "(default); json: its records")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the flips table of `args.store` at `args.dtype`."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # local weights only: before any hub import
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if args.sample < 1:
        raise InputError(f"--sample {args.sample}: give at least 1")
    store = store_ref(args)
    check_readable(store)
    from sweep.report.precision_flips import measure, render_markdown

    table = measure(store, args.dtype, args.sample, args.seed, args.model or None, args.device)
    if args.format == "json":
        records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                   for r in table.to_dict("records")]
        sys.stdout.write(json.dumps(records, indent=1) + "\n")
    else:
        sys.stdout.write(render_markdown(table, str(args.store)))
    return 0
