"""`sweep report STORE [--format md|csv|json] [--html FILE] [--plots DIR] [--tol T]
[--ci bootstrap|wilson] [--resamples N] [--seed S]`: the study's tables, in the terminal or as
one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from storage.errors import InputError, StoreDamagedError
from storage.integrity import SIZE, check_metadata, damage_message, scan_store
from storage.location import StoreLike, locate
from storage.query import open_results
from storage.store import open_root
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.cli.outputs import check_writable_folder
from sweep.report.html import render_html
from sweep.report.intervals import CI_METHODS, DEFAULT_RESAMPLES, Bootstrap
from sweep.report.plots import CAPTIONS, report_figures, write_plots
from sweep.report.tables import RENDERERS, build_report, render_csv, table_names
from sweep.terminal.printable import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand."""
    parser = subparsers.add_parser(
        "report",
        description="Print the study's tables (headline, per layer, depth, special tokens, "
        "baseline, whole rollout) for a sweep store, partial or complete.",
    )
    add_store_argument(parser)
    parser.add_argument("--format", choices=sorted(RENDERERS),
                        help="md (the default without --html): all sections; csv: the per-layer "
                        "rates; json: one object (rates, summary, baseline and the other "
                        "sections)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help="write the whole report with its figures as one self-contained HTML "
                        "page (opens offline); stdout then carries --format only if given")
    parser.add_argument("--table", choices=table_names(), default="rates",
                        help="with --format csv: which table (default: the per-layer rates; "
                        "controls: each model against its random-init control)")
    parser.add_argument("--plots", metavar="DIR", type=Path,
                        help="also write PNG figures (depth, baseline, margins) into DIR")
    parser.add_argument("--tol", type=float, metavar="T",
                        help="re-apply a tolerance to the stored margins (holds := margin <= T)")
    parser.add_argument("--ci", choices=CI_METHODS, default="bootstrap",
                        help="interval of the headline rates, trained - control differences "
                        "and lifts: bootstrap (default: a seeded cluster bootstrap over "
                        "inputs; paired for trained - control; the null's own uncertainty in "
                        "each lift) or wilson (Wilson; Newcombe for differences)")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, metavar="N",
                        help=f"bootstrap resamples per interval (default {DEFAULT_RESAMPLES})")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="bootstrap seed (default 0)")
    parser.set_defaults(func=run)


def check_readable(store: StoreLike) -> None:
    """StoreDamagedError if the store is half-created, a metadata document is not what the
    layout says, or a done task's chunks are missing or resized (one listing; `sweep status
    --verify` also re-hashes them)."""
    if locate(store).read("zarr.json") is None:
        return  # not a store at all: `open_results` says so
    root = open_root(store)
    if "config" not in root.attrs:
        raise StoreDamagedError(f"store {store}: half-created (its creation was interrupted); "
                                f"rerun `sweep run` with its config to finish it")
    check_metadata(store, root.attrs.get("models", []))
    damaged = scan_store(store, depth=SIZE)
    if damaged:
        raise StoreDamagedError(damage_message(store, damaged))


def check_html_path(path: Path) -> None:
    """InputError if `path` is a folder; the checks of `check_writable_folder` on its folder."""
    if path.is_dir():
        raise InputError(f"--html {path}: is a folder; give a file path such as report.html")
    check_writable_folder(path.parent if str(path.parent) else Path("."), "--html")


def run(args: argparse.Namespace) -> int:
    """Print the report of `args.store` on stdout; figures go to `args.plots`. Damage is one
    line (exit 4) naming the damaged variables, never a traceback."""
    store = store_ref(args)
    check_readable(store)
    if args.plots is not None:
        check_writable_folder(args.plots, "--plots")
    if args.html is not None:
        check_html_path(args.html)
    fmt = args.format or ("md" if args.html is None else None)
    try:
        with warnings.catch_warnings():  # zarr on the store's own bookkeeping folder `.sweep`
            warnings.filterwarnings("ignore", message=".*not recognized as a component")
            tree = open_results(store)
            if args.resamples < 1:
                raise InputError(f"--resamples {args.resamples}: give at least 1")
            report = build_report(tree, store=str(args.store), tol=args.tol, ci=args.ci,
                                  bootstrap=Bootstrap(args.resamples, args.seed))
            if fmt == "csv":
                text = render_csv(report, args.table)
            else:
                text = RENDERERS[fmt](report) if fmt else ""
            written = write_plots(tree, report, args.plots) if args.plots is not None else []
            if args.html is not None:
                figures = {name: (figure, CAPTIONS[name])
                           for name, figure in report_figures(tree, report).items()}
                args.html.parent.mkdir(parents=True, exist_ok=True)  # as --plots does
                args.html.write_text(render_html(report, figures), encoding="utf-8")
                written.append(args.html)
    except (InputError, OSError, KeyboardInterrupt):
        raise
    except Exception:  # a chunk that does not decode: name it if the checksums do
        damaged = scan_store(store)
        if damaged:
            raise StoreDamagedError(damage_message(store, damaged)) from None
        raise
    sys.stdout.write(text if fmt == "json" else printable(text))  # names from the store
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0
