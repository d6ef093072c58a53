"""The restriction's correctly rounded division (`restrict_kernel.quotients_into`) against the
CPU's vector division, on one renormalised row as the stage divides it.

Both divide the same 576 float64 entries by a row sum near 1, in L1, `--calls` times per round
(one numba loop each, no Python in between); reported: ns per entry, the best of `--rounds`
interleaved rounds, and whether the two results are equal bit for bit (each round's divisor is
new, so each checks another case).

    PYTHONPATH=. python benchmarks/division_bench.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

from workers.exact.restrict_kernel import fast_divisor, quotients_into


@njit(cache=True)
def divided(row: np.ndarray, out: np.ndarray, b: float, calls: int) -> None:
    """out = row / b, `calls` times: the division instruction LLVM vectorises the loop with."""
    for _ in range(calls):
        for k in range(row.shape[0]):
            out[k] = row[k] / b


@njit(cache=True)
def refined(row: np.ndarray, out: np.ndarray, b: float, calls: int) -> None:
    """out = row / b, `calls` times, by `quotients_into` (Markstein's refinement)."""
    for _ in range(calls):
        quotients_into(row, 0, out, 0, row.shape[0], b, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    row = rng.random(576) ** 4
    out = {name: np.empty_like(row) for name in ("divided", "refined")}
    best = {name: np.inf for name in out}
    equal = True
    for _ in range(args.rounds):
        b = 1.0 + rng.uniform(-1e-6, 1e-6)
        assert fast_divisor(b)
        for name, fn in (("divided", divided), ("refined", refined)):
            fn(row, out[name], b, 1)  # compiled (or loaded) before the timing
            start = time.perf_counter()
            fn(row, out[name], b, args.calls)
            best[name] = min(best[name], time.perf_counter() - start)
        equal &= np.array_equal(out["divided"].view(np.int64), out["refined"].view(np.int64))
    per_entry = {name: 1e9 * seconds / (args.calls * row.size) for name, seconds in best.items()}
    for name, ns in per_entry.items():
        print(f"{name:8s} {ns:.3f} ns per entry")
    print(f"refined / divided: {per_entry['refined'] / per_entry['divided']:.2f}; "
          f"bit for bit equal: {equal}")


if __name__ == "__main__":
    main()
