"""`sweep compare A B [--by layer] [--format text|csv|json]`: two stores side by side (a study
run twice, before and after a change, or two configs): `storage.query.compare.compare_stores`."""

from __future__ import annotations

import argparse
import json
import math

from storage.query.compare import compare_stores
from sweep.cli.commands.store_args import add_store_argument, store_ref


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        description="Per model and token set both stores hold (and layer, with --by layer): "
        "the holding rate in each (holding/cells), the difference a - b with its 95%% cluster "
        "bootstrap interval (paired over the inputs when both stores hold the same input ids "
        "with the same digests, else unpaired), and how many of the cells tested in both have "
        "a different verdict. Exit 2 when the stores share nothing to compare.",
    )
    add_store_argument(parser)
    parser.add_argument("other", metavar="STORE_B", help="the second store (same options)")
    parser.add_argument("--by", choices=("layer",), action="append", default=[],
                        help="also per layer")
    parser.add_argument("--format", choices=("text", "csv", "json"), default="text")
    parser.add_argument("--resamples", type=int, default=2000, metavar="N",
                        help="bootstrap resamples per interval (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.set_defaults(func=compare)


def compare(args: argparse.Namespace) -> int:
    a = store_ref(args)
    b = store_ref(argparse.Namespace(store=args.other, storage_option=args.storage_option))
    table = compare_stores(a, b, by=args.by, resamples=args.resamples, seed=args.seed)
    if args.format == "csv":
        print(table.to_csv(index=False), end="")
    elif args.format == "json":
        records = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in r.items()} for r in table.to_dict("records")]
        print(json.dumps({"a": str(a), "b": str(b), "rows": records}, indent=1, default=int))
    else:
        print(f"a: {a}\nb: {b}")
        keys = ["model", "token_set", *(["layer"] if "layer" in table else [])]
        print(" | ".join([*keys, "a holding/cells", "rate a", "b holding/cells", "rate b",
                          "a - b [95% CI]", "differ/compared"]))
        for r in table.to_dict("records"):
            print(" | ".join([*(str(r[k]) for k in keys),
                              f"{r['holding_a']}/{r['cells_a']}", _percent(r["rate_a"]),
                              f"{r['holding_b']}/{r['cells_b']}", _percent(r["rate_b"]),
                              f"{_points(r['difference'])} [{_points(r['ci_low'])}, "
                              f"{_points(r['ci_high'])}] {r['interval']}",
                              f"{r['differ']}/{r['compared']}"]))
    return 0


def _percent(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _points(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:+.1f} pp"
