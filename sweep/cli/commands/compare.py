"""`sweep compare A B [--by layer] [--format text|csv|json] [--resamples N] [--seed S]`: two
stores side by side (a study run twice, before and after a change, or two configs):
`storage.query.compare.compare_stores`, after the checks `sweep report` makes (a damaged or
half-created store is one line, exit 4), reading each store in one layout
(`storage.query.consistent`), names from the stores printed with their controls escaped."""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd

from storage.errors import InputError, StoreDamagedError
from storage.integrity import damage_message, scan_store
from storage.query.compare import compare_stores
from storage.query.consistent import read_consistently
from sweep.cli.commands.report import DEFAULT_RESAMPLES, check_bootstrap_options, check_readable
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.terminal.printable import printable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        description="Per model and token set both stores hold (and layer, with --by layer): "
        "the holding rate in each (holding/cells), the difference a - b with its 95% cluster "
        "bootstrap interval (paired over the inputs when both stores hold the same input ids "
        "with the same digests, else unpaired), and how many of the cells tested in both have "
        "a different verdict ('none compared' when no input is in both with the same "
        "content). Exit 2 when the stores share nothing to compare or a model's cells are not "
        "alike in both (head-averaged in one, every head in the other), 4 when a store is "
        "damaged.",
    )
    add_store_argument(parser)
    parser.add_argument("other", metavar="STORE_B", help="the second store (same options)")
    parser.add_argument("--by", choices=("layer",), action="append", default=[],
                        help="also per layer")
    parser.add_argument("--format", choices=("text", "csv", "json"), default="text")
    parser.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, metavar="N",
                        help=f"bootstrap resamples per interval (default {DEFAULT_RESAMPLES})")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.set_defaults(func=compare)


def compare(args: argparse.Namespace) -> int:
    """Print both stores side by side (see `register`); a damaged store is one line, exit 4,
    as `sweep report` says it."""
    check_bootstrap_options(args.resamples, args.seed)
    a = store_ref(args)
    b = store_ref(argparse.Namespace(store=args.other, storage_option=args.storage_option))

    def read() -> pd.DataFrame:
        for store in (a, b):
            check_readable(store)
        try:
            return compare_stores(a, b, by=args.by, resamples=args.resamples, seed=args.seed)
        except (InputError, OSError, KeyboardInterrupt):
            raise
        except Exception:  # a chunk that does not decode: name it if the checksums do
            for store in (a, b):
                damaged = scan_store(store)
                if damaged:
                    raise StoreDamagedError(damage_message(store, damaged)) from None
            raise

    table = read_consistently(a, lambda: read_consistently(b, read))
    if args.format == "csv":  # names from the stores: their control characters escaped
        print(printable(table.to_csv(index=False)), end="")
    elif args.format == "json":  # json.dumps escapes them itself
        records = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in r.items()} for r in table.to_dict("records")]
        print(json.dumps({"a": str(a), "b": str(b), "rows": records}, indent=1, default=int))
    else:
        print(printable("\n".join(text_lines(table, a, b))))
    return 0


def text_lines(table: pd.DataFrame, a: object, b: object) -> list[str]:
    """The text table: a header, a row per model and token set (and layer), and a note when
    some rows compared no cell one to one."""
    out = [f"a: {a}", f"b: {b}"]
    keys = ["model", "token_set", *(["layer"] if "layer" in table else [])]
    out.append(" | ".join([*keys, "a holding/cells", "rate a", "b holding/cells", "rate b",
                           "a - b [95% CI]", "differ/compared"]))
    for r in table.to_dict("records"):
        out.append(" | ".join([
            *(str(r[k]) for k in keys), f"{r['holding_a']}/{r['cells_a']}",
            _percent(r["rate_a"]), f"{r['holding_b']}/{r['cells_b']}", _percent(r["rate_b"]),
            f"{_points(r['difference'])} [{_points(r['ci_low'])}, {_points(r['ci_high'])}] "
            f"{r['interval']}",
            f"{r['differ']}/{r['compared']}" if r["compared"] else "none compared"]))
    if not table["compared"].all():
        out.append("none compared: no input is in both stores with the same content (input id "
                   "and digest), so no cell was compared one to one; the rates and their "
                   "unpaired interval are still the stores' own")
    return out


def _percent(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _points(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:+.1f} pp"
