"""`sweep check FILE.npy`: the equality test on an (n, n) or (b, n, n) array, a record a matrix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from storage.errors import InputError
from sweep.cli.outputs import add_format_argument
from workers.exact.equality import DEFAULT_TOL, EqualityResult, check


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `check` parser."""
    parser = subparsers.add_parser(
        "check",
        description="Exact (float64) equality test on an (n, n) or (b, n, n) row-stochastic array.",
    )
    parser.add_argument("file", type=Path, help=".npy file holding an (n, n) or (b, n, n) array")
    parser.add_argument(
        "--tol", type=float, default=DEFAULT_TOL,
        help=f"tightness tolerance on the margin (default {DEFAULT_TOL:g})",
    )
    add_format_argument(parser, ("text", "json"), help="text: a table, one line a matrix "
                        "(default); json: one JSON record a line")
    parser.set_defaults(func=run)


def check_npy_size(path: Path) -> None:
    """InputError, before any allocation, if the header's shape and dtype need more bytes than
    the file holds (a truncated file, or a header that lies)."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(handle)
            offset = handle.tell()
    except (ValueError, OSError, EOFError, SyntaxError) as error:
        raise InputError(f"{path}: not a readable .npy array ({error})") from None
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    held = path.stat().st_size - offset
    if needed > held:
        raise InputError(
            f"{path}: its header claims shape {shape} {dtype} ({needed:,} bytes) but the file "
            f"holds {held:,} bytes of data; the file is truncated or not a numpy.save file"
        )


def load_matrices(path: Path) -> np.ndarray:
    """The array in a .npy file (no pickles); InputError naming the file when it is not one."""
    if not path.is_file():
        raise InputError(f"{path}: no such file (give a .npy file written by numpy.save)")
    check_npy_size(path)
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npy array ({error})") from error


def text_table(result: EqualityResult) -> str:
    """A readable table, one line per matrix."""
    lines = [
        f"{'matrix':>6} {'kappa':>12} {'kappa_factor':>12} {'bound':>12} {'margin':>10} "
        f"{'holds':>5} {'charac.':>7} {'pair':>11} {'attaining':>9}"
    ]
    for m, r in enumerate(result.records()):
        pair = "-" if r["pair"] is None else f"{r['pair'][0]},{r['pair'][1]}"
        lines.append(
            f"{m:>6} {r['kappa']:>12.9f} {r['kappa_factor']:>12.9f} {r['bound']:>12.9f} "
            f"{r['margin']:>10.3e} {str(r['holds']):>5} {str(r['holds_by_characterisation']):>7} "
            f"{pair:>11} {r['attaining_pairs']:>9}"
        )
    holding = int(np.count_nonzero(result.holds))
    lines.append(
        f"{len(result.holds)} matrices, {holding} tight, "
        f"{result.disagreements} disagreements between definition and characterisation"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Load, validate and test; print a table (text) or the records (json lines)."""
    arrays = load_matrices(args.file)
    try:
        result = check(arrays, tol=args.tol, progress=True)
    except InputError as error:
        raise InputError(f"{args.file}: {error}") from error
    if args.format == "json":
        for record in result.records():
            print(json.dumps(record))
    else:
        print(text_table(result))
    if result.disagreements:
        print(
            f"sweep check: warning: {result.disagreements} matrices where margin <= tol and the "
            "self-dominance characterisation disagree (a bug or a tolerance at rounding level)",
            file=sys.stderr,
        )
    return 0
