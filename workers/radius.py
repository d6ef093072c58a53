"""The decision radius: how far a tested matrix can move before its verdict could change.

Distance is the row-l1 norm of a stochastic perturbation E (rows of X + E still sum to 1, as
every matrix the test sees is renormalised): ||E|| = max_i sum_k |E_ik|. Under it, for any pair
p = (i, j), kappa_p moves by at most ||E|| and the self-dominance gap
g_p = min(X_kk - X_lk, X_ll - X_kl) by at most ||E|| (E_kk >= -||E||/2, E_lk <= ||E||/2), and
margin = (1 + kappa(X))/2 - kappa((I + X)/2) by at most ||E||. Hence (docs/readings.md):

- tight cell (margin <= tol): radius = min over pairs p of max((kappa - kappa_p)/2, g_p),
  clipped below at 0: within it, a pair attaining kappa stays self-dominant and every pair that
  could overtake it stays self-dominant, so the margin stays exactly 0;
- failing cell (margin > tol): radius = max(margin - tol,
  min over pairs p of max((kappa - kappa_p)/2 - tol, (-g_p)+ - 2 tol)): the margin is
  1-Lipschitz, and a pair can only come within tol of being an attaining self-dominant pair once
  the perturbation has closed both its kappa gap and its worse self-dominance deficit.

Both are lower bounds of the true radius, exact when one pair decides (n = 2 always); no
perturbation with ||E|| < radius changes the verdict (in exact arithmetic on the perturbed
matrix: the test's own float64 rounding, ~n 2^-53, is far below any dtype's). Every float equals
a float64 brute force (a plain double loop over the pairs, `tests/test_radius.py`) bit for bit,
kappa_p summed as `kernel.tv_one` sums it; pairs that cannot lower the running minimum are
skipped.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workers.kernel import tv_one


@njit(cache=True)
def dominance_gap(x: np.ndarray, i: int, j: int) -> float:
    """g_ij = min(X_ii - X_ji, X_jj - X_ij): >= 0 iff rows i, j are mutually self-dominant."""
    return min(x[i, i] - x[j, i], x[j, j] - x[i, j])


SCREEN_SLACK = 1e-9  # far above the float64 rounding of two kappa_ij sums (n 2^-53 each)


@njit(cache=True)
def reference_distances(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kappa_{k, r} of every row k of `rows` to two reference rows: the first of `rows`, and the
    row farthest from it; kappa_ij <= kappa_ir + kappa_rj screens pairs (triangle inequality)."""
    m = rows.shape[0]
    first = np.empty(m, dtype=np.float64)
    for p in range(m):
        first[p] = tv_one(x, rows[0], rows[p])
    far = rows[np.argmax(first)]
    second = np.empty(m, dtype=np.float64)
    for p in range(m):
        second[p] = tv_one(x, far, rows[p])
    return first, second


@njit(cache=True)
def tight_radius(x: np.ndarray, rows: np.ndarray, kappa: float) -> float:
    """min over pairs i < j of `rows` of max((kappa - kappa_ij)/2, g_ij), clipped at 0, for one
    (n, n) matrix. kappa_ij is only summed for pairs whose g_ij is below the running minimum and
    whose triangle bound on kappa_ij (`reference_distances`) does not already put
    (kappa - kappa_ij)/2 above it: skipped pairs cannot lower the minimum."""
    best = np.inf
    m = rows.shape[0]
    first, second = reference_distances(x, rows)
    for p in range(m):
        for q in range(p + 1, m):
            i, j = rows[p], rows[q]
            g = dominance_gap(x, i, j)
            if g >= best:
                continue
            upper = min(first[p] + first[q], second[p] + second[q]) + SCREEN_SLACK
            if upper < kappa - 2.0 * best:
                continue
            value = max(0.5 * (kappa - tv_one(x, i, j)), g)
            if value < best:
                best = value
                if best <= 0.0:
                    return 0.0
    return max(best, 0.0)


@njit(cache=True)
def failing_radius(x: np.ndarray, rows: np.ndarray, kappa: float, margin: float,
                   tol: float) -> float:
    """max(margin - tol, min over pairs i < j of `rows` of
    max((kappa - kappa_ij)/2 - tol, (-g_ij)+ - 2 tol)) for one (n, n) matrix that fails."""
    floor = margin - tol
    best = np.inf
    m = rows.shape[0]
    first, second = reference_distances(x, rows)
    for p in range(m):
        for q in range(p + 1, m):
            i, j = rows[p], rows[q]
            h = max(-dominance_gap(x, i, j), 0.0) - 2.0 * tol
            if h >= best:
                continue
            upper = min(first[p] + first[q], second[p] + second[q]) + SCREEN_SLACK
            if upper < kappa - 2.0 * (best + tol):
                continue
            value = max(0.5 * (kappa - tv_one(x, i, j)) - tol, h)
            if value < best:
                best = value
                if best <= floor:
                    return floor
    return max(floor, best)


@njit(cache=True)
def _radii(x: np.ndarray, rows: np.ndarray, kappa: np.ndarray, margin: np.ndarray,
           holds: np.ndarray, tol: float, out: np.ndarray) -> None:
    for b in range(x.shape[0]):
        if holds[b]:
            out[b] = tight_radius(x[b], rows, kappa[b])
        else:
            out[b] = failing_radius(x[b], rows, kappa[b], margin[b], tol)


def decision_radius(x: np.ndarray, rows: np.ndarray, kappa: np.ndarray, margin: np.ndarray,
                    holds: np.ndarray, tol: float) -> np.ndarray:
    """(b,) float64 radius of each matrix of a validated float64 (b, n, n) stack tested over the
    pairs of `rows` (sorted indices, at least two), given its verdicts (kappa, margin, holds at
    tol): `failing_radius` where it fails, `tight_radius` where it holds."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    out = np.empty(x.shape[0], dtype=np.float64)
    _radii(x, rows, np.asarray(kappa, dtype=np.float64), np.asarray(margin, dtype=np.float64),
           np.asarray(holds, dtype=np.bool_), float(tol), out)
    return out
