"""`sweep report STORE [--format text|csv|json] [--html FILE] [--plots DIR] [--tol T]
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
from storage.query.consistent import read_consistently
from storage.store import open_root
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.cli.outputs import add_format_argument, check_writable_folder
from sweep.cli.report_cache import ReportCache, entry_key
from sweep.terminal.printable import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand (its choices are FORMATS, CI_METHODS, DEFAULT_RESAMPLES:
    `sweep.report` itself loads pandas, which a cached report does not need)."""
    parser = subparsers.add_parser(
        "report",
        description="Print the study's report for a sweep store, partial or complete, section "
        f"by section: {'; '.join(name for name, _ in SECTIONS)}.",
    )
    add_store_argument(parser)
    add_format_argument(parser, FORMATS, default=None,
                        help="text (the default without --html): every section, in Markdown; "
                        "csv: the per-layer rates; json: one object (rates, summary, baseline "
                        "and the other sections)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help="write the whole report with its figures as one self-contained HTML "
                        "page (opens offline); stdout then carries --format only if given")
    parser.add_argument("--table", default="rates",
                        help="with --format csv: which table, by its key in --format json "
                        "(default: the per-layer rates; controls: each model against its "
                        "random-init control)")
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
    parser.add_argument("--no-cache", action="store_true",
                        help="compute everything again and keep nothing (by default what was "
                        "computed from the store is kept in the user's cache folder, "
                        "$SWEEP_CACHE_DIR to choose another, and reused while the store, the "
                        "options and the code are unchanged)")
    parser.set_defaults(func=run)


SECTIONS = (
    ("headline findings", "Headline findings"),
    ("1. headline rates, beside size-matched nulls", "1. Headline"),
    ("controls (each model against its random initialisation)", "Controls"),
    ("seeds (the rate across training seeds)", "Seeds"),
    ("2. per layer (and per head)", "2. Per layer"),
    ("3. depth", "3. Depth"),
    ("4. special tokens", "4. Special tokens"),
    ("5. baseline", "5. Baseline"),
    ("6. whole rollout", "6. Whole rollout"),
    ("7. training", "7. Training"),
    ("tightness over training", "Tightness over training"),
    ("detail: intervals and precision", "Detail"),
    ("findings (every one, with its rule)", "Findings"),
)
"""The report's sections in the order of its Markdown, each with how its heading starts
(`## <heading>`; tests/test_doc_snippets.py checks a rendered report against it): the
command's description names them."""
FORMATS = ("csv", "json", "text")
CACHED_AS = {"text": "md"}  # the Markdown text keeps its cache name from before `text`
"""`sweep.report.tables.RENDERERS`' names (tests/test_report_cache.py checks they agree)."""
CI_METHODS = ("wilson", "bootstrap")  # sweep.report.intervals.CI_METHODS
DEFAULT_RESAMPLES = 2000  # sweep.report.intervals.DEFAULT_RESAMPLES
REPORT = "report.json"  # the cache's name of the `Report` itself (`sweep.cli.report_cache`)


MAX_RESAMPLES = 1_000_000  # 8 MB of float64 per resampled statistic


def check_bootstrap_options(resamples: int, seed: int) -> None:
    """InputError (one line) unless 1 <= `resamples` <= MAX_RESAMPLES and `seed` >= 0 (what
    numpy's seeding takes): `sweep report` and `sweep compare` alike."""
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise InputError(f"--resamples {resamples}: give 1 to {MAX_RESAMPLES:,} (the default "
                         f"{DEFAULT_RESAMPLES} gives intervals to a fraction of a point)")
    if seed < 0:
        raise InputError(f"--seed {seed}: give 0 or more")


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
    line (exit 4) naming the damaged variables, never a traceback. What it renders is kept in
    the report cache (`sweep.cli.report_cache`) unless --no-cache: a second rendering of an
    unchanged store reads it back (--plots always computes)."""
    store = store_ref(args)
    if args.plots is not None:
        check_writable_folder(args.plots, "--plots")
    if args.html is not None:
        check_html_path(args.html)
    check_bootstrap_options(args.resamples, args.seed)
    fmt = args.format or ("text" if args.html is None else None)
    name = None if fmt is None else f"csv-{args.table}" if fmt == "csv" else CACHED_AS.get(fmt, fmt)
    options = {"store": str(args.store), "tol": args.tol, "ci": args.ci,
               "resamples": args.resamples, "seed": args.seed}
    location = locate(store)
    key = None if args.no_cache else entry_key(location, options)
    cache = None if key is None else ReportCache(key)
    if cache is not None and args.plots is None:
        text = b"" if name is None else cache.read(name)
        page = None if args.html is None else cache.read("html")
        if text is not None and (args.html is None or page is not None):
            return write_outputs(text.decode(), fmt, args.html, page, [])
    text, page, written, report = read_consistently(  # one layout, even while a run compacts
        store, lambda: render(store, args, fmt, cache))
    if cache is not None and entry_key(location, options) == key:  # unchanged meanwhile
        cache.dump(REPORT, report)
        if name is not None:
            cache.write(name, text.encode())
        if page is not None:
            cache.write("html", page)
    return write_outputs(text, fmt, args.html, page, written)


def write_outputs(text: str, fmt: str | None, html: Path | None, page: bytes | None,
                  written: list[Path]) -> int:
    """Write the HTML page (if any), the text on stdout (control characters from the store
    escaped but in JSON, which escapes its own), and name the files written."""
    if html is not None and page is not None:
        html.parent.mkdir(parents=True, exist_ok=True)  # as --plots does
        html.write_bytes(page)
        written = [*written, html]
    sys.stdout.write(text if fmt == "json" else printable(text))  # names from the store
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def render(store: StoreLike, args: argparse.Namespace, fmt: str | None,
           cache: ReportCache | None) -> tuple[str, bytes | None, list[Path], object]:
    """The text of `fmt`, the HTML page (with --html), the figures written (--plots) and the
    `Report`, computed from the store (the `Report` read back from `cache` if kept there)."""
    from storage.query import open_results
    from storage.query.results import in_memory
    from sweep.report.intervals import Bootstrap
    from sweep.report.tables import RENDERERS, Report, build_report, render_csv, table_names

    if fmt == "csv" and args.table not in table_names():
        raise InputError(f"--table {args.table}: not a table of the report; one of "
                         f"{', '.join(table_names())}")
    report = None if cache is None else cache.load(REPORT, Report)
    if report is None or args.plots is not None or args.html is not None:
        check_readable(store)  # a kept Report was built from this very store, checked then
    try:
        with warnings.catch_warnings():  # zarr on the store's own bookkeeping folder `.sweep`
            warnings.filterwarnings("ignore", message=".*not recognized as a component")
            tree = None
            if report is None or args.plots is not None or args.html is not None:
                tree = in_memory(open_results(store))  # each array read once, when it fits
            if report is None:
                report = build_report(tree, store=str(args.store), tol=args.tol, ci=args.ci,
                                      bootstrap=Bootstrap(args.resamples, args.seed))
            if fmt == "csv":
                text = render_csv(report, args.table)
            else:
                text = RENDERERS[fmt](report) if fmt else ""
            written, page = [], None
            if args.plots is not None or args.html is not None:  # matplotlib: only for these
                from sweep.report.html import render_html
                from sweep.report.plots import CAPTIONS, report_figures, write_plots
            if args.plots is not None:
                written = write_plots(tree, report, args.plots)
            if args.html is not None:
                figures = {name: (figure, CAPTIONS[name])
                           for name, figure in report_figures(tree, report).items()}
                page = render_html(report, figures).encode("utf-8")
    except (InputError, OSError, KeyboardInterrupt):
        raise
    except Exception:  # a chunk that does not decode: name it if the checksums do
        damaged = scan_store(store)
        if damaged:
            raise StoreDamagedError(damage_message(store, damaged)) from None
        raise
    return text, page, written, report
