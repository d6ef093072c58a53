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
kappa_p summed as `kernel.tv_one` sums it.

Cost: `screened_radius` runs inside `check`'s kernel on the 16-bit screen the kernel already
made (`workers.exact.pruned`): Q_p gives an upper bound U_p >= kappa_p, so (kappa - U_p)/2 bounds a
pair's kappa term from below. Pairs are visited in rising bands of that lower bound (LEVELS);
only pairs whose bound and self-dominance term are both below the running minimum are summed
(once: a later band skips what an earlier one summed), and a band that ends with the minimum
inside it ends the search. `listed_radius` takes every
pair's kappa_p already summed (the `content-pairs` reading sums them all anyway).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workers.exact.kernel import tv_one

LEVELS = np.array([2.0**-12, 2.0**-9, 2.0**-6, 2.0**-3, np.inf])
"""Upper ends of the bands of the pairs' lower bounds, visited in order: attention's radii lie
mostly below 2^-9, so the first bands hold the pairs that decide and the later ones are reached
only when the minimum is large."""


@njit(cache=True)
def dominance_gap(x: np.ndarray, i: int, j: int) -> float:
    """g_ij = min(X_ii - X_ji, X_jj - X_ij): >= 0 iff rows i, j are mutually self-dominant."""
    return min(x[i, i] - x[j, i], x[j, j] - x[i, j])


@njit(cache=True)
def gap_term(g: float, tight: bool, tol: float) -> float:
    """A pair's self-dominance term: g (tight cell) or (-g)+ - 2 tol (failing cell)."""
    return g if tight else max(-g, 0.0) - 2.0 * tol


@njit(cache=True)
def pair_value(kappa: float, kappa_p: float, gap: float, tight: bool, tol: float) -> float:
    """A pair's value in the minimum, `gap` its `gap_term`: max((kappa - kappa_p)/2, g) (tight)
    or max((kappa - kappa_p)/2 - tol, (-g)+ - 2 tol) (failing), in the brute force's order."""
    if tight:
        return max(0.5 * (kappa - kappa_p), gap)
    return max(0.5 * (kappa - kappa_p) - tol, gap)


@njit(cache=True)
def finish(best: float, tight: bool, floor: float) -> float:
    """The radius from the minimum over the pairs: clipped at 0 (tight) or at the margin's
    floor margin - tol (failing)."""
    return max(best, 0.0) if tight else max(floor, best)


@njit(cache=True)
def settled(best: float, tight: bool, floor: float) -> bool:
    """No further pair can change the radius: the minimum reached 0 (tight) or the floor."""
    return best <= 0.0 if tight else best <= floor


@njit(cache=True)
def keep_limit(c0: float, kappa: float, limit: float, tight: bool, tol: float,
               scale: float) -> int:
    """The largest screened Q_p (generous) of a pair whose kappa term can be below `limit`:
    the term is below it only if U_p = c0 - Q_p / scale > kappa - 2 (limit + tol') (tol' = 0
    tight, tol failing), i.e. Q_p < scale (c0 - kappa + 2 (limit + tol')); 1e-15 and a relative
    1e-12 cover the rounding of the term and of this line. 65535 (every pair) for no limit."""
    if limit == np.inf:
        return 65535
    reach = (c0 - kappa) + 2.0 * (limit + (0.0 if tight else tol)) + 1e-15
    return min(np.int64(reach * scale * (1.0 + 1e-12)), 65535)


@njit(cache=True)
def screened_radius(x: np.ndarray, screened: np.ndarray, row_min: np.ndarray, scale: float,
                    c0: float, kappa: float, margin: float, tol: float) -> float:
    """The radius of one (n >= 2, n) float64 matrix x over all its pairs i < j, given its
    oracle kappa and margin and the kernel's screen: `screened` (Q_ij for i < j, uint16) with
    c0 - Q_ij / scale >= the oracle's kappa_ij, `row_min` (n - 1,) each row's smallest Q_ij."""
    n = x.shape[0]
    tight = margin <= tol
    floor = margin - tol
    best = np.inf
    done_q, done_limit = -1, -np.inf  # the last band's final filter: what passed it was summed
    for level in LEVELS:
        limit = min(level, best)
        q = keep_limit(c0, kappa, limit, tight, tol, scale)
        for i in range(n - 1):
            if row_min[i] > q:
                continue
            row = screened[i]
            for j in range(i + 1, n):
                screen = np.int64(row[j])
                if screen > q:
                    continue
                gap = gap_term(dominance_gap(x, i, j), tight, tol)
                if gap >= limit or (screen <= done_q and gap < done_limit):
                    continue  # cannot lower the minimum, or summed in an earlier band
                value = pair_value(kappa, tv_one(x, i, j), gap, tight, tol)
                if value < best:
                    best = value
                    if settled(best, tight, floor):
                        return finish(best, tight, floor)
                    if best < limit:
                        limit = best
                        q = keep_limit(c0, kappa, limit, tight, tol, scale)
        if best <= level:
            break
        done_q, done_limit = q, limit
    return finish(best, tight, floor)


@njit(cache=True)
def listed_radius(x: np.ndarray, rows: np.ndarray, kappa_pairs: np.ndarray, kappa: float,
                  margin: float, tol: float) -> float:
    """The radius of one (n, n) float64 matrix over the pairs i < j of `rows` (sorted indices,
    at least two), given each pair's oracle kappa_ij in row-major pair order."""
    tight = margin <= tol
    floor = margin - tol
    best = np.inf
    m = rows.shape[0]
    c = 0
    for p in range(m):
        for q in range(p + 1, m):
            gap = gap_term(dominance_gap(x, rows[p], rows[q]), tight, tol)
            if gap < best:
                best = min(best, pair_value(kappa, kappa_pairs[c], gap, tight, tol))
                if settled(best, tight, floor):
                    return finish(best, tight, floor)
            c += 1
    return finish(best, tight, floor)
