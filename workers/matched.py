"""Size-matched nulls: a null's holding rate at one model's own matrix sizes.

The sizes: for one model and token set, every (input, layer) cell whose test ran with status OK
and kept n >= 2 tokens contributes its n (`n_kept`); these N cells, sorted by n, form the size
list s_0 <= ... <= s_{N-1}. Trial t of T draws one matrix of size s_{floor(t * N / T)}: every
cell gets floor(T/N) or ceil(T/N) trials, evenly spread over the sorted list, so the null rate
estimates the mean of p(n) over exactly the cells the observed rate counts (exactly, when T is
a multiple of N). Only the size histogram matters, so a task keeps (distinct sizes, counts).

Seeds: trials are cut into blocks of `workers.baseline.BLOCK`; block k draws its sizes in
ascending order from SeedSequence(seed, spawn_key=(MATCHED_TAG, stable_int(model),
stable_int(token set), null code, k)). Counts are the same however blocks are grouped into tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from storage.errors import InputError
from storage.layout import ResultStatus
from workers.baseline import BLOCK
from workers.equality import DEFAULT_TOL
from workers.nulls import count_holding, get_null, stable_int

MATCHED_TAG = stable_int("matched-null")  # first spawn-key word: apart from config-size keys


@dataclass(frozen=True)
class SizeHistogram:
    """Distinct matrix sizes (ascending) and how many tested cells have each."""

    sizes: tuple[int, ...]
    counts: tuple[int, ...]

    @property
    def cells(self) -> int:
        return sum(self.counts)

    def runs(self, trials: int, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """(size, trials of that size) among trials [start, stop) of `trials`, ascending size.

        Trial t takes the size at position floor(t * N / trials) of the sorted size list; the
        trials of the cells [lo, hi) are [ceil(lo * trials / N), ceil(hi * trials / N)).
        Exact integer arithmetic, O(distinct sizes).
        """
        total, low = self.cells, 0
        if total == 0:
            return
        for size, count in zip(self.sizes, self.counts, strict=True):
            high = low + count
            first, last = -(-low * trials // total), -(-high * trials // total)
            overlap = min(last, stop) - max(first, start)
            if overlap > 0:
                yield size, overlap
            low = high

    def trial_sizes(self, trials: int, start: int, stop: int) -> np.ndarray:
        """The size of each trial in [start, stop), in trial order; (stop - start,) int64."""
        runs = list(self.runs(trials, start, stop))
        return np.repeat([s for s, _ in runs], [c for _, c in runs]).astype(np.int64)


def size_histograms(n_kept: np.ndarray, status: np.ndarray) -> list[SizeHistogram]:
    """Per token set, the histogram of the tested cells' sizes (status OK and n >= 2).

    `n_kept` and `status` are a model's (input, layer, token_set) result variables. Raises
    InputError if some cell is not computed yet: the size distribution would be incomplete.
    """
    n_kept, status = np.asarray(n_kept), np.asarray(status)
    pending = int(np.count_nonzero(status == ResultStatus.NOT_COMPUTED))
    if pending:
        raise InputError(
            f"{pending} result cells are not computed yet: the model's test tasks must finish "
            "before its size-matched nulls"
        )
    histograms = []
    for s in range(status.shape[-1]):
        tested = (status[..., s] == ResultStatus.OK) & (n_kept[..., s] >= 2)
        sizes, counts = np.unique(n_kept[..., s][tested], return_counts=True)
        histograms.append(SizeHistogram(tuple(int(v) for v in sizes),
                                        tuple(int(c) for c in counts)))
    return histograms


def matched_key(model: str, token_set: str, null: str, block: int) -> tuple[int, ...]:
    """Spawn key of block `block` of one (model, token set, null)'s size-matched trials."""
    return (MATCHED_TAG, stable_int(f"model:{model}"), stable_int(f"token_set:{token_set}"),
            get_null(null).code, block)


def matched_holding(histogram: SizeHistogram, trials: int, blocks: Iterable[tuple[int, int]],
                    *, model: str, token_set: str, null: str, seed: int,
                    tol: float = DEFAULT_TOL) -> tuple[int, int, int]:
    """(trials, holding, disagreements) over the given (block index, trials) blocks of one
    (model, token set, null)'s `trials` size-matched trials. No tested cell: (0, 0, 0)."""
    if histogram.cells == 0:
        return 0, 0, 0
    draw = get_null(null)
    done = holding = disagreements = 0
    for index, count in blocks:
        start = index * BLOCK
        key = matched_key(model, token_set, null, index)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
        for n, run in histogram.runs(trials, start, start + count):
            h, d = count_holding(draw, rng, n, run, tol)
            done, holding, disagreements = done + run, holding + h, disagreements + d
    return done, holding, disagreements
