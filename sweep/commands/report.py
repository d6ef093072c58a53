"""`sweep report STORE [--format md|csv|json] [--plots DIR] [--tol T]`: the study's tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from storage.query import open_results
from sweep.plots import write_plots
from sweep.report import RENDERERS, build_report, render_csv, table_names


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand."""
    parser = subparsers.add_parser(
        "report",
        description="Print the study's tables (headline, per layer, depth, special tokens, "
        "baseline, whole rollout) for a sweep store, partial or complete.",
    )
    parser.add_argument("store", help="the sweep's Zarr store (a directory)")
    parser.add_argument("--format", choices=sorted(RENDERERS), default="md",
                        help="md: all sections; csv: the per-layer rates; json: one object "
                        "(rates, summary, baseline and the other sections)")
    parser.add_argument("--table", choices=table_names(), default="rates",
                        help="with --format csv: which table (default: the per-layer rates; "
                        "controls: each model against its random-init control)")
    parser.add_argument("--plots", metavar="DIR", type=Path,
                        help="also write PNG figures (depth, baseline, margins) into DIR")
    parser.add_argument("--tol", type=float, metavar="T",
                        help="re-apply a tolerance to the stored margins (holds := margin <= T)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report of `args.store` on stdout; figures go to `args.plots`."""
    tree = open_results(args.store)
    report = build_report(tree, store=str(args.store), tol=args.tol)
    if args.format == "csv":
        sys.stdout.write(render_csv(report, args.table))
    else:
        sys.stdout.write(RENDERERS[args.format](report))
    if args.plots is not None:
        for path in write_plots(tree, report, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0
