"""The Monte Carlo baseline: how often is the bound tight for uniformly random stochastic matrices?

Rows are i.i.d. uniform on the simplex (Dirichlet(1): normalised exponentials). Trials of size n
are cut into fixed blocks of BLOCK trials; block k draws from its own generator,
SeedSequence(seed, spawn_key=(n, k)). A count over any union of blocks is therefore the same
however the blocks are grouped into tasks: the result depends only on (n, trials, seed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy.stats import norm

from workers.equality import DEFAULT_TOL, check
from workers.errors import InputError

BLOCK = 1000  # trials per block: the unit of randomness, fixed so results never depend on chunks
DRAW_BYTES = 1 << 25  # float64 bytes drawn at once within a block (32 MiB)
Z95 = float(norm.ppf(0.975))  # 1.959963984540054


def draw_uniform_stochastic(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """b random (n, n) matrices whose rows are i.i.d. uniform on the simplex; (b, n, n) float64."""
    e = rng.standard_exponential(size=(b, n, n))  # (matrix, row, column)
    return e / e.sum(axis=2, keepdims=True)


def baseline_blocks(trials: int) -> list[tuple[int, int]]:
    """The (block index, trials in it) of a run of `trials` trials: BLOCK each, the last shorter."""
    return [(k, min(BLOCK, trials - k * BLOCK)) for k in range(-(-trials // BLOCK))]


def holding_in_blocks(
    n: int, seed: int, blocks: Iterable[tuple[int, int]], tol: float = DEFAULT_TOL
) -> tuple[int, int]:
    """(holding, disagreements) over the given (block index, trials) blocks of size-n trials.

    holding counts matrices with margin <= tol; disagreements counts matrices where that
    definition and the characterisation disagree (expected 0, reported, never hidden).
    """
    holding = disagreements = 0
    per_draw = max(1, DRAW_BYTES // (8 * n * n))
    for index, count in blocks:
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n, index)))
        for start in range(0, count, per_draw):
            result = check(
                draw_uniform_stochastic(rng, min(per_draw, count - start), n),
                tol=tol,
                validate=False,
            )
            holding += int(np.count_nonzero(result.holds))
            disagreements += result.disagreements
    return holding, disagreements


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default); exact 0 / 1 ends."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if k == 0 else float(centre - half)
    high = 1.0 if k == n else float(centre + half)
    return low, high


def baseline_record(n: int, trials: int, holding: int, disagreements: int) -> dict:
    """JSON-ready record of one size: n, trials, holding, rate, ci_low, ci_high, disagreements."""
    low, high = wilson_interval(holding, trials)
    return {
        "n": n,
        "trials": trials,
        "holding": holding,
        "rate": holding / trials,
        "ci_low": low,
        "ci_high": high,
        "disagreements": disagreements,
    }


def run_baseline(
    sizes: Sequence[int],
    trials: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """One `baseline_record` per size, in-process; `progress(trials_done)` after each block."""
    if trials < 1 or seed < 0 or not sizes or any(n < 1 for n in sizes):
        raise InputError(
            f"baseline needs trials >= 1, seed >= 0 and sizes >= 1; got trials={trials}, "
            f"seed={seed}, sizes={list(sizes)}"
        )
    records = []
    for n in sizes:
        holding = disagreements = 0
        for block in baseline_blocks(trials):
            h, d = holding_in_blocks(n, seed, [block])
            holding, disagreements = holding + h, disagreements + d
            if progress is not None:
                progress(block[1])
        records.append(baseline_record(n, trials, holding, disagreements))
    return records
