"""`sweep baseline`: Monte Carlo tightness rate of uniformly random stochastic matrices by size."""

from __future__ import annotations

import argparse
import json

from tqdm import tqdm

from workers.baseline import run_baseline
from workers.errors import InputError

DEFAULT_SIZES = "2,3,4,8,16,32,64,128,256"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `baseline` parser."""
    parser = subparsers.add_parser(
        "baseline",
        description="Rows i.i.d. uniform on the simplex; the result depends only on the sizes, "
        "the trials and the seed.",
    )
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma list (default {DEFAULT_SIZES})"
    )
    parser.add_argument("--trials", type=int, default=10_000, help="trials a size (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="root seed, >= 0 (default 0)")
    parser.add_argument("--format", choices=("json", "text"), default="json")
    parser.set_defaults(func=run)


def parse_sizes(text: str) -> list[int]:
    """'2,3,8' -> [2, 3, 8]; InputError naming the bad item."""
    sizes = []
    for item in text.split(","):
        try:
            sizes.append(int(item))
        except ValueError:
            raise InputError(
                f"--sizes item {item!r} is not an integer: give a comma list such as 2,4,8"
            ) from None
    return sizes


def run(args: argparse.Namespace) -> int:
    """Run the baseline in-process; progress bar on stderr once a run takes over two seconds."""
    sizes = parse_sizes(args.sizes)
    total = args.trials * len(sizes) if args.trials > 0 else None
    with tqdm(total=total, unit="trial", delay=2.0, desc="baseline") as bar:
        records = run_baseline(sizes, args.trials, args.seed, progress=bar.update)
    if args.format == "json":
        for record in records:
            print(json.dumps(record))
    else:
        print(f"{'n':>5} {'trials':>8} {'holding':>8} {'rate':>7} {'95% CI':>17}")
        for r in records:
            print(
                f"{r['n']:>5} {r['trials']:>8} {r['holding']:>8} {r['rate']:>7.4f} "
                f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]"
            )
    disagreements = sum(r["disagreements"] for r in records)
    if disagreements:
        tqdm.write(
            f"sweep baseline: warning: {disagreements} matrices where the definition and the "
            "characterisation disagree"
        )
    return 0
