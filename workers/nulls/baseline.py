"""The config-size baseline: how often is the bound tight for a null's random matrices at size n?

Trials of size n are cut into fixed blocks of BLOCK trials; block k of null `null` draws from
its own generator, SeedSequence(seed, spawn_key=NULLS[null].config_key(n, k)) (`uniform`: the
original key (n, k)). A count over any union of blocks is therefore the same however the blocks
are grouped into tasks: the result depends only on (null, n, trials, seed).

Blocks are streamed (`BlockSpan` is a lazy range): memory and planning time never grow with the
number of trials, and a chunk's blocks are found in O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from storage.errors import InputError
from storage.query.statistics import wilson_interval
from workers.exact.equality import DEFAULT_TOL
from workers.nulls.registry import (
    DRAW_BYTES,  # noqa: F401 - re-exported: the draw size is part of the baseline's contract
    check_sizes_fit,
    count_holding,
    draw_uniform_stochastic,  # noqa: F401 - re-exported for benchmarks and older callers
    get_null,
)

BLOCK = 1000  # trials per block: the unit of randomness, fixed so results never depend on chunks


def n_blocks(trials: int) -> int:
    """Blocks in a run of `trials` trials (the last one may be shorter)."""
    return -(-trials // BLOCK)


@dataclass(frozen=True)
class BlockSpan:
    """Blocks [start, stop) of a run of `trials` trials; iterates (block index, trials in it).

    Lazy: holds three integers whatever the number of blocks.
    """

    trials: int
    start: int
    stop: int

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for k in range(self.start, self.stop):
            yield k, min(BLOCK, self.trials - k * BLOCK)

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    @property
    def trial_count(self) -> int:
        """Trials in these blocks, in O(1)."""
        return max(0, min(self.stop * BLOCK, self.trials) - self.start * BLOCK)


def baseline_blocks(trials: int) -> BlockSpan:
    """The (block index, trials in it) of a run of `trials` trials: BLOCK each, the last shorter."""
    return BlockSpan(trials, 0, n_blocks(trials))


def chunk_span(trials: int, chunk_trials: int, chunk: int) -> BlockSpan:
    """The blocks of chunk `chunk` when `trials` are cut into chunks of `chunk_trials` (a multiple
    of BLOCK) trials: O(1), whatever the number of trials."""
    if chunk_trials % BLOCK:
        raise ValueError(f"chunk_trials {chunk_trials} is not a multiple of {BLOCK}")
    per_chunk = chunk_trials // BLOCK
    return BlockSpan(trials, chunk * per_chunk, min((chunk + 1) * per_chunk, n_blocks(trials)))


def holding_in_blocks(
    n: int, seed: int, blocks: Iterable[tuple[int, int]], tol: float = DEFAULT_TOL,
    null: str = "uniform", progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """(holding, disagreements) over the given (block index, trials) blocks of size-n trials of
    `null`; `progress(b)` after each draw of b matrices (at most 32 MiB of them).

    holding counts matrices with margin <= tol; disagreements counts matrices where that
    definition and the characterisation disagree (expected 0, reported, never hidden).
    """
    model = get_null(null)
    holding = disagreements = 0
    for index, count in blocks:
        key = model.config_key(n, index)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
        h, d = count_holding(model, rng, n, count, tol, progress)
        holding, disagreements = holding + h, disagreements + d
    return holding, disagreements


def baseline_record(n: int, trials: int, holding: int, disagreements: int,
                    null: str = "uniform") -> dict:
    """JSON-ready record of one (null, size): null, n, trials, holding, rate, ci_low, ci_high,
    disagreements."""
    low, high = wilson_interval(holding, trials)
    return {
        "null": null,
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
    nulls: Sequence[str] = ("uniform",),
) -> list[dict]:
    """One `baseline_record` per (null, size), nulls outer, in-process; `progress(trials_done)`
    after each draw (at most 32 MiB of matrices: a block, for small n). Streams blocks: memory is
    flat in `trials`. InputError for bad arguments and for sizes whose matrices cannot fit in
    this machine's memory."""
    if trials < 1 or seed < 0 or not sizes or any(n < 1 for n in sizes):
        raise InputError(
            f"baseline needs trials >= 1, seed >= 0 and sizes >= 1; got trials={trials}, "
            f"seed={seed}, sizes={list(sizes)}"
        )
    for null in nulls:
        get_null(null)
    check_sizes_fit(sizes)
    records = []
    for null in nulls:
        for n in sizes:
            holding = disagreements = 0
            h, d = holding_in_blocks(n, seed, baseline_blocks(trials), null=null,
                                     progress=progress)
            holding, disagreements = holding + h, disagreements + d
            records.append(baseline_record(n, trials, holding, disagreements, null))
    return records
