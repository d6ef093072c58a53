"""Size-matched nulls: a null's holding rate at one model's own matrix sizes.

The sizes: for one model and token set, every (input, layer) cell whose test ran with status OK
and kept n >= 2 tokens contributes its n (`n_kept`); these N cells, sorted by n, form the size
list s_0 <= ... <= s_{N-1}. Trial t of T draws one matrix of size s_{floor(t * N / T)}: every
cell gets floor(T/N) or ceil(T/N) trials, evenly spread over the sorted list, so the null rate
estimates the mean of p(n) over exactly the cells the observed rate counts (exactly, when T is
a multiple of N). Only the size histogram matters, so a task keeps (distinct sizes, counts).

Full-row readings (`content-pairs`, `FULL_ROW_READINGS`) are drawn as they are read: a cell's size
is (T, |C|), the input's real tokens and the rows compared; a trial draws one T x T matrix and
takes kappa over the pairs of its last |C| rows only, on the full rows (`workers.exact.readings.
content_pairs`), its first T - |C| tokens standing for the special ones. Every null's law is
unchanged by permuting tokens (rows and columns together), so which |C| rows are compared does
not change the rate.

Seeds: trials are cut into blocks of `workers.nulls.baseline.BLOCK`; block k draws its sizes in
ascending order from SeedSequence(seed, spawn_key=(MATCHED_TAG, stable_int("model:<model>"),
stable_int("token_set:<token set>"), null code, k)). Counts are the same however blocks are
grouped into tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from storage.errors import InputError
from storage.layout import ResultStatus
from workers.exact.equality import DEFAULT_TOL
from workers.exact.readings import content_pairs
from workers.nulls.baseline import BLOCK
from workers.nulls.registry import DRAW_BYTES, NullModel, count_holding, get_null, stable_int

MATCHED_TAG = stable_int("matched-null")  # first spawn-key word: apart from config-size keys
FULL_ROW_READINGS = ("content-pairs",)  # token sets whose null draws T x T, pairs among |C| rows

Size = int | tuple[int, int]  # n (n x n matrices), or (T, |C|) for a full-row reading


@dataclass(frozen=True)
class SizeHistogram:
    """Distinct matrix sizes (ascending) and how many tested cells have each; a full-row
    reading's sizes are (T, |C|) pairs, in lexicographic order."""

    sizes: tuple[Size, ...]
    counts: tuple[int, ...]

    @property
    def cells(self) -> int:
        return sum(self.counts)

    def runs(self, trials: int, start: int, stop: int) -> Iterator[tuple[Size, int]]:
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
        """The size of each trial in [start, stop), in trial order; (stop - start,) int64, or
        (stop - start, 2) for (T, |C|) sizes."""
        runs = list(self.runs(trials, start, stop))
        return np.repeat(np.asarray([s for s, _ in runs], dtype=np.int64),
                         [c for _, c in runs], axis=0)


def size_histograms(n_kept: np.ndarray, status: np.ndarray, n_tokens: np.ndarray | None = None,
                    token_sets: Sequence[str] = ()) -> list[SizeHistogram]:
    """Per token set, the histogram of the tested cells' sizes (status OK and n >= 2): n, or
    (T, n) for a token set in `token_sets` that is a full-row reading (`FULL_ROW_READINGS`),
    T from `n_tokens` (input,).

    `n_kept` and `status` are a model's (input, layer[, head], token_set) result variables.
    Raises InputError if some cell is not computed yet: the size distribution would be
    incomplete.
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
        if s < len(token_sets) and token_sets[s] in FULL_ROW_READINGS:
            if n_tokens is None:
                raise ValueError(f"token set {token_sets[s]!r} needs each input's n_tokens")
            rows = np.broadcast_to(np.asarray(n_tokens).reshape(-1, *[1] * (tested.ndim - 1)),
                                   tested.shape)
            pairs = np.stack([rows[tested], n_kept[..., s][tested]], axis=1).reshape(-1, 2)
            sizes, counts = np.unique(pairs, axis=0, return_counts=True)
            histograms.append(SizeHistogram(tuple((int(t), int(c)) for t, c in sizes),
                                            tuple(int(c) for c in counts)))
            continue
        sizes, counts = np.unique(n_kept[..., s][tested], return_counts=True)
        histograms.append(SizeHistogram(tuple(int(v) for v in sizes),
                                        tuple(int(c) for c in counts)))
    return histograms


def count_full_row_holding(null: NullModel, rng: np.random.Generator, tokens: int, rows: int,
                           count: int, tol: float = DEFAULT_TOL) -> tuple[int, int]:
    """(holding, disagreements) among `count` draws of `null` of size `tokens` read as
    `content-pairs` over the pairs of their last `rows` rows (full rows), from `rng`; at most
    DRAW_BYTES of matrices at once."""
    holding = disagreements = 0
    compared = np.arange(tokens - rows, tokens)
    per_draw = max(1, DRAW_BYTES // (8 * tokens * tokens))
    for start in range(0, count, per_draw):
        verdicts = content_pairs(null.draw(rng, min(per_draw, count - start), tokens), compared,
                                 tol)
        holding += int(np.count_nonzero(verdicts["holds"]))
        disagreements += int(np.count_nonzero(
            verdicts["holds"] != verdicts["holds_by_characterisation"]))
    return holding, disagreements


def _counter(size: Size) -> Callable[[NullModel, np.random.Generator, int, float],
                                     tuple[int, int]]:
    """How trials of `size` are counted: n x n matrices by `check`, (T, |C|) as content-pairs."""
    if isinstance(size, tuple):
        return lambda null, rng, count, tol: count_full_row_holding(null, rng, *size, count, tol)
    return lambda null, rng, count, tol: count_holding(null, rng, size, count, tol)


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
        for size, run in histogram.runs(trials, start, start + count):
            h, d = _counter(size)(draw, rng, run, tol)
            done, holding, disagreements = done + run, holding + h, disagreements + d
    return done, holding, disagreements
