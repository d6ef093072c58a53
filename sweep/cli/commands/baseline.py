"""`sweep baseline`: Monte Carlo tightness rate of random stochastic matrices by null and size."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from storage.errors import InputError
from sweep.cli.outputs import add_format_argument
from sweep.terminal.progress import progress
from workers.nulls.baseline import run_baseline
from workers.nulls.registry import NULLS, parse_nulls

DEFAULT_SIZES = "2,3,4,8,16,32,64,128,256"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `baseline` parser."""
    parser = subparsers.add_parser(
        "baseline",
        description="Random row-stochastic matrices from named null models; the result depends "
        "only on the null, the sizes, the trials and the seed. Streams its trials: memory does "
        "not grow with --trials, and Ctrl-C stops it (exit 130).",
    )
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, help=f"comma list (default {DEFAULT_SIZES})"
    )
    parser.add_argument("--trials", type=parse_trials, default=10_000,
                        help="trials per null and size, e.g. 10000 or 1e6 (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="root seed, >= 0 (default 0)")
    parser.add_argument(
        "--null", action="append", metavar="NAME",
        help=f"null model, repeatable or a comma list; 'all' for every one "
        f"({', '.join(NULLS)}; default uniform)",
    )
    add_format_argument(parser, ("text", "json"), help="text: a table, one line per null and "
                        "size (default); json: one JSON record a line")
    parser.set_defaults(func=run)


def parse_trials(text: str) -> int:
    """'10000' or '1e12' -> an int; argparse's one-line error for anything not a whole number."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer() or value > 2**62:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of trials")
    return int(value)


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


@contextmanager
def interrupt_between_draws() -> Iterator[threading.Event]:
    """Ctrl-C sets the yielded event instead of raising where it lands: inside a compiled kernel
    numba would turn KeyboardInterrupt into a SystemError. The caller raises KeyboardInterrupt
    between draws. Only in the main thread (elsewhere signals cannot be handled: a no-op)."""
    hit = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield hit
        return
    previous = signal.signal(signal.SIGINT, lambda *_: hit.set())
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, previous)


def run(args: argparse.Namespace) -> int:
    """Run the baseline in-process; progress on stderr (`sweep.terminal.progress`: a bar on a
    terminal, a plain line every 30 s off one); Ctrl-C stops it after the current draw
    (KeyboardInterrupt: `sweep.cli` exits 130)."""
    sizes = parse_sizes(args.sizes)
    nulls = parse_nulls(args.null or ["uniform"])
    total = args.trials * len(sizes) * len(nulls) if args.trials > 0 else 0
    reporter = progress(total, "baseline", "trial")
    try:
        with interrupt_between_draws() as interrupted:

            def step(done: int) -> None:
                reporter.update(done)
                if interrupted.is_set():
                    raise KeyboardInterrupt

            records = run_baseline(sizes, args.trials, args.seed, progress=step, nulls=nulls)
    except BaseException:
        reporter.close(final=False)  # the error (or Ctrl-C's line) is the last line
        raise
    reporter.close()
    if args.format == "json":
        for record in records:
            print(json.dumps(record))
    else:
        print(f"{'null':<13} {'n':>5} {'trials':>8} {'holding':>8} {'rate':>7} {'95% CI':>17}")
        for r in records:
            print(
                f"{r['null']:<13} {r['n']:>5} {r['trials']:>8} {r['holding']:>8} "
                f"{r['rate']:>7.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]"
            )
    disagreements = sum(r["disagreements"] for r in records)
    if disagreements:
        print(
            f"sweep baseline: warning: {disagreements} matrices where the definition and the "
            "characterisation disagree", file=sys.stderr
        )
    return 0
