"""`sweep show STORE MODEL INPUT_ID [--layer L] [--token-set S] [--head H] [--png FILE]`: one input
up close, from the store alone (no model is built)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from storage.errors import InputError
from storage.integrity import check_metadata
from storage.store import open_model, open_root
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.cli.outputs import check_writable_folder
from sweep.show.source import describe_input
from sweep.show.view import read_input, render_table
from sweep.terminal.printable import printable
from workers.exact.token_kinds import TOKEN_SETS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `show` subcommand."""
    parser = subparsers.add_parser(
        "show",
        description="One input up close: per layer κ(A), κ(M), the margin, the verdict and the "
        "pair (i, j) attaining κ with its token kinds and self-dominance entries A_ii, A_ji, "
        "A_jj, A_ij; and what the input was. Reads the store only.",
    )
    add_store_argument(parser)
    parser.add_argument("model", help="a model of the store (as in `sweep report`)")
    parser.add_argument("input_id", metavar="INPUT_ID",
                        help="the input's id (e.g. line-3, an image's relative path, row-17)")
    parser.add_argument("--layer", type=int, action="append", metavar="L",
                        help="only this layer (repeatable; default: every layer)")
    parser.add_argument("--token-set", default="all", choices=sorted(TOKEN_SETS),
                        help="the reading whose verdict is shown (default: all)")
    parser.add_argument("--head", help="the head of a model that kept each head (default: "
                        "the first; `mean` for a head-averaged model)")
    parser.add_argument("--inputs", metavar="PATH",
                        help="where this model's inputs are (the file, folder or source its "
                        "config named), to show what the input was; a store's recorded path "
                        "is never opened on its own (a store may name any file)")
    parser.add_argument("--png", type=Path, metavar="FILE",
                        help="also draw a heat map of one layer (the first of --layer, else the "
                        "first layer where the bound is not tight, else the last)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the view of one input; with --png, write the heat map of one layer."""
    store = store_ref(args)
    if args.png is not None:
        if args.png.is_dir():
            raise InputError(f"--png {args.png}: is a folder; give a file path such as pair.png")
        check_writable_folder(args.png.parent, "--png")
    if args.model in open_root(store).attrs.get("models", []):
        check_metadata(store, [args.model])  # one line, exit 4, never zarr's traceback
    with warnings.catch_warnings():  # zarr on the store's own bookkeeping folder `.sweep`
        warnings.filterwarnings("ignore", message=".*not recognized as a component")
        layers = sorted(set(args.layer)) if args.layer else None
        view = read_input(store, args.model, args.input_id, layers=layers,
                          token_set=args.token_set, head=args.head)
        about = describe_input(dict(open_model(store, args.model).attrs), args.input_id,
                               view.token_kind, args.inputs)
    # ids, tokens and the input's text come from a store and a dataset: controls escaped
    sys.stdout.write(printable(render_table(view, about.line, about.labels)))
    if args.png is not None:
        from sweep.show.figure import heatmap_figure

        position = _drawn_layer(view, args.layer)
        figure = heatmap_figure(view, position, about.labels, about.picture, about.patch)
        args.png.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.png, dpi=120, bbox_inches="tight")
        print(f"wrote {args.png} (layer {view.rows[position].layer})", file=sys.stderr)
    return 0


def _drawn_layer(view, asked: list[int] | None) -> int:
    """Position in `view.rows` of the layer to draw."""
    if asked:
        return [row.layer for row in view.rows].index(asked[0])
    failing = [k for k, row in enumerate(view.rows) if row.verdict == "not tight"]
    return failing[0] if failing else len(view.rows) - 1
