"""kappa of a matrix whose rows crowd around a common centre (rollout products), in O(n^2) plus
a few pairs, equal to the float64 oracle bit for bit. Pure numba, no I/O.

Triangle inequality through any centre c: ||x_i - x_j||_1 <= d_i + d_j with d_i = ||x_i - c||_1.
With c the column-wise median of a sample of rows, the rows of a rollout product (mostly a
common part, plus each row's own diagonal mass) are near c, and few pairs have d_i + d_j as large
as a known pair's distance. The known pair: the row farthest from c and the row farthest from
it. Only pairs whose bound (rounding included) reaches it are summed, in the oracle's order
(`kernel.tv_pairs`), so the largest value found is the oracle's kappa. Where more than `limit`
pairs survive (rows spread over the simplex: attention itself, a first rollout factor; rows all
about equally far apart) it gives up in O(n^2 + limit).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workers.exact.kernel import U64, tv_one, tv_pairs

SAMPLE_ROWS = 15  # rows whose column-wise median is the centre (31 cost 4x the time for little)


@njit(cache=True)
def centre(x: np.ndarray) -> np.ndarray:
    """(n,) the column-wise median of rows 0, s, 2 s, ... of x (an odd number, at most
    SAMPLE_ROWS): any centre gives a valid bound, a central one a tight bound. The sampled rows
    are sorted column by column with an odd-even transposition network (whole rows of min and
    max, which vectorise)."""
    n = x.shape[0]
    step = max(1, -(-n // SAMPLE_ROWS))
    m = (n + step - 1) // step
    m -= 1 - m % 2  # odd: one middle row
    rows = np.empty((m, x.shape[1]))
    for s in range(m):
        rows[s] = x[s * step]
    for r in range(m):
        for a in range(r % 2, m - 1, 2):
            low, high = rows[a], rows[a + 1]
            for k in range(x.shape[1]):
                u, v = low[k], high[k]
                low[k], high[k] = min(u, v), max(u, v)
    return rows[m // 2].copy()


@njit(cache=True, fastmath={"reassoc", "contract"})
def distances(x: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """out[i] = sum_k |x_ik - c_k| in any order (vectorised): within gamma_{n+1} of exact."""
    for i in range(x.shape[0]):
        s = 0.0
        for k in range(x.shape[1]):
            s += abs(x[i, k] - c[k])
        out[i] = s


@njit(cache=True)
def survivors(d: np.ndarray, order: np.ndarray, factor: float, reach: float, limit: int):
    """(i < j) int64 of the pairs with (d_i + d_j) * factor >= reach (`order`: d descending
    along it), or two empty arrays when more than `limit` qualify."""
    n = d.shape[0]
    count = 0
    for a in range(n - 1):
        i = order[a]
        if (d[i] + d[order[a + 1]]) * factor + 1e-290 < reach:
            break  # d descends: no later pair reaches either
        for b in range(a + 1, n):
            if (d[i] + d[order[b]]) * factor + 1e-290 < reach:
                break
            count += 1
        if count > limit:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    rows_i = np.empty(count, dtype=np.int64)
    rows_j = np.empty(count, dtype=np.int64)
    p = 0
    for a in range(n - 1):
        i = order[a]
        for b in range(a + 1, n):
            j = order[b]
            if (d[i] + d[j]) * factor + 1e-290 < reach:
                break
            rows_i[p], rows_j[p] = min(i, j), max(i, j)
            p += 1
        if p == count:
            break
    return rows_i, rows_j


@njit(cache=True)
def centre_kappa(x: np.ndarray, limit: int) -> float:
    """The oracle's kappa of a trusted finite float64 (n >= 2, n) matrix, or -1.0 when more than
    `limit` pairs survive the centre bound (nothing is decided then)."""
    n = x.shape[0]
    d = np.empty(n)
    distances(x, centre(x), d)
    far = np.argmax(d)
    apart = np.empty(n)
    distances(x, x[far], apart)  # the farthest row against every row
    apart[far] = -1.0
    near = np.argmax(apart)
    best = tv_one(x, min(far, near), max(far, near))  # the oracle's: a lower bound on kappa
    # the oracle's 2 kappa_ij <= (d_i + d_j) * factor: the rounding of d_i, d_j (gamma_{n+1}
    # each way), of the oracle's sum and of this expression, generously
    factor = 1.0 + 16.0 * (n + 4) * U64
    rows_i, rows_j = survivors(d, np.argsort(-d), factor, 2.0 * best, limit)
    if rows_i.shape[0] == 0:  # too many: the pair (far, near) itself always survives
        return -1.0
    return max(best, tv_pairs(x, rows_i, rows_j).max())
