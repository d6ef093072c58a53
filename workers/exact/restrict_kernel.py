"""One pass from stored attention to the restricted, renormalised float64 stack. Pure numba.

`equality.restrict_layers` is defined by numpy steps: validate the whole (L, T, T) stack
(`kernel.normalise_rows`: finite, >= 0, rows within the tolerance of 1, divided by `row_sum`),
gather the kept rows and columns, divide each kept row by its numpy sum over the kept columns
(`ndarray.sum`: pairwise, `pairwise_sum` below), renormalise again (`normalise_rows`).
`restrict_into` does the same arithmetic in the same order, row by row into a caller's buffer,
so its output equals those steps bit for bit without their five full-size temporaries.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workers.exact.kernel import row_sum

PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: blocks up to this size are summed with 8 accumulators


STACK_DEPTH = 64  # pairwise_sum's explicit stack: halving from 2^63 terms to a block


@njit(cache=True)
def block_sum(a: np.ndarray, start: int, n: int) -> float:
    """numpy's sum of a run of at most PAIRWISE_BLOCK terms: a plain loop below 8 terms, else
    8 interleaved accumulators, combined as a tree, then the remainder added in order."""
    if n < 8:
        res = 0.0
        for i in range(start, start + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = 8
    top = n - n % 8
    while i < top:
        r0 += a[start + i]
        r1 += a[start + i + 1]
        r2 += a[start + i + 2]
        r3 += a[start + i + 3]
        r4 += a[start + i + 4]
        r5 += a[start + i + 5]
        r6 += a[start + i + 6]
        r7 += a[start + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[start + i]
        i += 1
    return res


@njit(cache=True)
def pairwise_sum(a: np.ndarray, n: int, frames: np.ndarray, partial: np.ndarray) -> float:
    """a[:n].sum() of a float64 vector exactly as numpy adds a contiguous run: blocks of at
    most PAIRWISE_BLOCK terms (`block_sum`), larger runs split in halves rounded down to a
    multiple of 8, summed left + right. numpy recurses; this walks the same tree with an
    explicit stack (`frames` (STACK_DEPTH, 3) int64: start, length, stage; `partial`
    (STACK_DEPTH,) float64: left sums), since numba cannot cache recursive functions."""
    if n <= PAIRWISE_BLOCK:
        return block_sum(a, 0, n)
    top = 0
    frames[0, 0], frames[0, 1], frames[0, 2] = 0, n, 0
    value = 0.0
    while top >= 0:
        start, length, stage = frames[top, 0], frames[top, 1], frames[top, 2]
        if length <= PAIRWISE_BLOCK:
            value = block_sum(a, start, length)
            top -= 1
            continue
        half = length // 2
        half -= half % 8
        if stage == 0:  # descend left
            frames[top, 2] = 1
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start, half, 0
        elif stage == 1:  # left done: keep it, descend right
            partial[top] = value
            frames[top, 2] = 2
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start + half, length - half, 0
        else:  # right done
            value = partial[top] + value
            top -= 1
    return value


@njit(cache=True)
def checked_row(a: np.ndarray, layer: int, i: int, row: np.ndarray) -> float:
    """row = float64(a[layer, i]); returns its `kernel.row_sum` (same four accumulators, same
    order), or NaN when an entry is negative or NaN (an infinite entry makes the sum infinite)."""
    n = row.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    bad = False
    quad = n - n % 4
    for k in range(0, quad, 4):
        v0, v1 = np.float64(a[layer, i, k]), np.float64(a[layer, i, k + 1])
        v2, v3 = np.float64(a[layer, i, k + 2]), np.float64(a[layer, i, k + 3])
        bad |= not ((v0 >= 0.0) & (v1 >= 0.0) & (v2 >= 0.0) & (v3 >= 0.0))
        row[k], row[k + 1], row[k + 2], row[k + 3] = v0, v1, v2, v3
        s0 += v0
        s1 += v1
        s2 += v2
        s3 += v3
    for k in range(quad, n):
        v = np.float64(a[layer, i, k])
        bad |= not (v >= 0.0)
        row[k] = v
        s0 += v
    return np.nan if bad else (s0 + s1) + (s2 + s3)


@njit(cache=True)
def restrict_into(a: np.ndarray, kept: np.ndarray, row_sum_tol: float, out: np.ndarray,
                  ok: np.ndarray) -> bool:
    """Restrict every layer of a (L, T, T) float32/float64 stack to the sorted token indices
    `kept` (m,) into out[:L, :m, :m] (float64), as `equality.restrict_layers` defines it;
    ok[l] is False when a kept row of layer l has no mass on the kept tokens (its rows of
    `out` are then undefined). Returns False, with `out` undefined, when any entry of `a` is
    not finite and >= 0 or any row (kept or not) or renormalised kept row misses 1 by more than
    row_sum_tol: the caller then raises the numpy path's precise error."""
    n_layers, t = a.shape[0], a.shape[1]
    m = kept.shape[0]
    first = kept[0]
    run = kept[m - 1] - first == m - 1  # one run of tokens (all, all but CLS, ...): a slice
    row = np.empty(t, dtype=np.float64)
    sub = np.empty(m, dtype=np.float64)
    frames = np.empty((STACK_DEPTH, 3), dtype=np.int64)
    partial = np.empty(STACK_DEPTH, dtype=np.float64)
    for layer in range(n_layers):
        ok[layer] = True
        r = 0
        for i in range(t):
            total = checked_row(a, layer, i, row)
            if not abs(total - 1.0) <= row_sum_tol:  # also NaN: a bad entry
                return False
            if r == m or kept[r] != i:
                continue
            r += 1
            if not ok[layer]:
                continue
            if run:
                for c in range(m):
                    sub[c] = row[first + c] / total
            else:
                for c in range(m):
                    sub[c] = row[kept[c]] / total
            mass = pairwise_sum(sub, m, frames, partial)
            if mass == 0.0:
                ok[layer] = False
                continue
            for c in range(m):
                sub[c] = sub[c] / mass
            again = row_sum(sub)
            if not abs(again - 1.0) <= row_sum_tol:
                return False
            for c in range(m):
                out[layer, r - 1, c] = sub[c] / again
    return True
