"""Numba kernels for the pairwise total variation of row-stochastic matrices. Pure, no I/O.

`equality.check` on the CPU screens with `workers.exact.pruned` (uint16 upper bounds, exact
pruning); this module holds the float32 screen behind `check(device=...)` (torch.cdist) and the
tests, the exact verification both share (`exact_verdict`, `characterise`, dense and sparse
oracle-order sums) and the float64 kappa of rollouts (`kappa_over_matrices`). The float32 route, per
matrix:

1. Screen (fast, float32, SIMD): for every row pair i < j an estimate of
   kappa_ij(A) = 1/2 sum_k |A_ik - A_jk| = 1/2 (r_i + r_j) - sum_k min(A_ik, A_jk)  (r: row sums),
   computed as 1 - sum_k min(x_ik, x_jk) with x = float32(A), in 4x4 row tiles (16 accumulators,
   LLVM vectorises over k). `screen_error` bounds |estimate - exact| rigorously.
2. Verify (exact, float64): every pair whose estimate could attain the maximum (within the error
   bound and the tolerance window) is recomputed in the oracle's order -- a sequential
   left-to-right float64 sum -- so every returned number equals the float64 brute force bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from workers.exact import numba_cache

numba_cache.configure()  # before any kernel below is defined: a cache folder per kernel version

TILE = 4  # rows per side of a register tile: 4 x 4 pairs, 16 float32 accumulators
SUPER = 64  # rows per side of a cache block of tiles (two 64-row slabs fit in L2)
U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53  # unit roundoff of float64


def padded_rows(n: int) -> int:
    """Rows of the float32 copy and of the screen output: n rounded up to a whole tile."""
    return -(-n // TILE) * TILE


def tile_order(n: int) -> np.ndarray:
    """Upper-triangular (i0, j0) tile origins, grouped into SUPER x SUPER cache blocks; (t, 2)."""
    return _tile_order(padded_rows(n)).copy()


@functools.lru_cache(maxsize=64)
def _tile_order(rows: int) -> np.ndarray:
    starts = range(0, rows, TILE)
    tiles = [(i0, j0) for i0 in starts for j0 in starts if j0 >= i0]
    tiles.sort(key=lambda t: (t[0] // SUPER, t[1] // SUPER, t[0], t[1]))
    return np.array(tiles, dtype=np.int64).reshape(-1, 2)


@njit(cache=True)
def row_sum(row: np.ndarray) -> float:
    """Sum of a float64 row with four interleaved accumulators (error <= gamma_n * sum |row|)."""
    n = row.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    quad = n - n % 4
    for k in range(0, quad, 4):
        s0 += row[k]
        s1 += row[k + 1]
        s2 += row[k + 2]
        s3 += row[k + 3]
    for k in range(quad, n):
        s0 += row[k]
    return (s0 + s1) + (s2 + s3)


@njit(cache=True)
def normalise_rows(x: np.ndarray, row_sum_tol: float) -> tuple[int, int, int, int]:
    """Renormalise the rows of a (b, n, n) float64 batch in place, or find the first bad entry.

    Returns (0, -1, -1, -1) when every entry is finite and >= 0 and every row sums to 1 within
    row_sum_tol (rows then divided by their float64 sum); else (code, matrix, row, column) of
    the first offender in C order: code 1 a non-finite entry, else 2 a negative entry, else 3 a
    row sum off 1 (column -1). Nothing is modified unless the whole batch is valid.
    """
    b, n = x.shape[0], x.shape[1]
    flat = x.reshape(-1)
    suspect = False
    for e in range(flat.shape[0]):  # branch-free screen: passes iff 0 <= x < inf (so not NaN)
        suspect |= not ((flat[e] >= 0.0) & (flat[e] < np.inf))
    if suspect:
        for e in range(flat.shape[0]):
            if not np.isfinite(flat[e]):
                return 1, e // (n * n), e // n % n, e % n
        for e in range(flat.shape[0]):
            if flat[e] < 0.0:
                return 2, e // (n * n), e // n % n, e % n
    sums = np.empty((b, n), dtype=np.float64)
    for m in range(b):
        for i in range(n):
            sums[m, i] = row_sum(x[m, i])
            if abs(sums[m, i] - 1.0) > row_sum_tol:
                return 3, m, i, -1
    for m in range(b):
        for i in range(n):
            total = sums[m, i]
            for k in range(n):
                x[m, i, k] = x[m, i, k] / total
    return 0, -1, -1, -1


def screen_buffers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Reusable (x, out) for one n: the float32 copy (zero padding rows) and the screen output.

    Reusing them matters: every fresh multi-MiB array costs page faults that rival the screen.
    """
    rows = padded_rows(n)
    return np.zeros((rows, n), dtype=np.float32), np.empty((rows, rows), dtype=np.float32)


@njit(cache=True)
def fill_float32(a: np.ndarray, x: np.ndarray) -> None:
    """x[:n] = float32(a) (round to nearest) for an (n, n) a; x's padding rows stay zero."""
    n = a.shape[0]
    for i in range(n):
        for k in range(n):
            x[i, k] = np.float32(a[i, k])


@njit(fastmath=True, cache=True)
def _screen_tile(x: np.ndarray, i0: int, j0: int, out: np.ndarray) -> None:
    """out[i0+a, j0+b] = 1 - sum_k min(x[i0+a, k], x[j0+b, k]) for a, b in 0..3 (any sum order)."""
    n = x.shape[1]
    a0 = x[i0]
    a1 = x[i0 + 1]
    a2 = x[i0 + 2]
    a3 = x[i0 + 3]
    b0 = x[j0]
    b1 = x[j0 + 1]
    b2 = x[j0 + 2]
    b3 = x[j0 + 3]
    z = np.float32(0.0)
    s00 = s01 = s02 = s03 = z
    s10 = s11 = s12 = s13 = z
    s20 = s21 = s22 = s23 = z
    s30 = s31 = s32 = s33 = z
    for k in range(n):
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        y0, y1, y2, y3 = b0[k], b1[k], b2[k], b3[k]
        s00 += min(x0, y0)
        s01 += min(x0, y1)
        s02 += min(x0, y2)
        s03 += min(x0, y3)
        s10 += min(x1, y0)
        s11 += min(x1, y1)
        s12 += min(x1, y2)
        s13 += min(x1, y3)
        s20 += min(x2, y0)
        s21 += min(x2, y1)
        s22 += min(x2, y2)
        s23 += min(x2, y3)
        s30 += min(x3, y0)
        s31 += min(x3, y1)
        s32 += min(x3, y2)
        s33 += min(x3, y3)
    one = np.float32(1.0)
    out[i0, j0], out[i0, j0 + 1], out[i0, j0 + 2], out[i0, j0 + 3] = (
        one - s00, one - s01, one - s02, one - s03)
    out[i0 + 1, j0], out[i0 + 1, j0 + 1], out[i0 + 1, j0 + 2], out[i0 + 1, j0 + 3] = (
        one - s10, one - s11, one - s12, one - s13)
    out[i0 + 2, j0], out[i0 + 2, j0 + 1], out[i0 + 2, j0 + 2], out[i0 + 2, j0 + 3] = (
        one - s20, one - s21, one - s22, one - s23)
    out[i0 + 3, j0], out[i0 + 3, j0 + 1], out[i0 + 3, j0 + 2], out[i0 + 3, j0 + 3] = (
        one - s30, one - s31, one - s32, one - s33)


@njit(cache=True)
def screen_serial(x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """out[i, j] = screened kappa_ij for every i < j (upper triangle; (padded, padded) float32)."""
    for t in range(tiles.shape[0]):
        _screen_tile(x, tiles[t, 0], tiles[t, 1], out)


@njit(parallel=True, cache=True)
def screen_parallel(x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """`screen_serial` with the tiles spread over the numba threads."""
    for t in prange(tiles.shape[0]):
        _screen_tile(x, tiles[t, 0], tiles[t, 1], out)


@njit(cache=True)
def screen_error(a: np.ndarray) -> float:
    """Rigorous bound on |screened kappa_ij - exact kappa_ij| + |oracle - exact|, any i < j.

    Screen: float32 input rounding (u * sum min) + summation in any order (gamma_{n-1} * sum min,
    sum min <= max row sum) + the final 1 - s (u) + |1 - (r_i + r_j)/2| (rows off 1) + underflow
    and flush-to-zero (n * 2^-120). Also covers torch.cdist(p=1)/2 (input and difference rounding
    plus gamma_{n-1} * (r_i + r_j)/2 ). Oracle: float64 sums of n terms, 4 (n + 4) u64 on A or M.
    """
    n = a.shape[0]
    rmax = 1.0
    rdev = 0.0
    for i in range(n):
        r = row_sum(a[i])
        rmax = max(rmax, r)
        rdev = max(rdev, abs(r - 1.0))
    screen = 1.01 * (n + 3) * U32 * rmax + 1.01 * rdev + n * 2.0**-120
    return screen + 4.0 * (n + 4) * U64 * rmax  # the oracle; also row_sum's own error


@njit(cache=True)
def tv_pairs(x: np.ndarray, rows_i: np.ndarray, rows_j: np.ndarray) -> np.ndarray:
    """The oracle's kappa_ij(X) for each listed pair: 0.5 * (sequential left-to-right float64 sum
    of |x_ik - x_jk|). Four pairs run side by side, each in the oracle's order; (pairs,)."""
    n = x.shape[1]
    count = rows_i.shape[0]
    out = np.empty(count, dtype=np.float64)
    quad = count - count % 4
    for c in range(0, quad, 4):
        i0, i1, i2, i3 = rows_i[c], rows_i[c + 1], rows_i[c + 2], rows_i[c + 3]
        j0, j1, j2, j3 = rows_j[c], rows_j[c + 1], rows_j[c + 2], rows_j[c + 3]
        s0 = s1 = s2 = s3 = 0.0
        for k in range(n):
            s0 += abs(x[i0, k] - x[j0, k])
            s1 += abs(x[i1, k] - x[j1, k])
            s2 += abs(x[i2, k] - x[j2, k])
            s3 += abs(x[i3, k] - x[j3, k])
        out[c], out[c + 1], out[c + 2], out[c + 3] = 0.5 * s0, 0.5 * s1, 0.5 * s2, 0.5 * s3
    for c in range(quad, count):
        s = 0.0
        for k in range(n):
            s += abs(x[rows_i[c], k] - x[rows_j[c], k])
        out[c] = 0.5 * s
    return out


@njit(cache=True)
def lazy_factor(a: np.ndarray) -> np.ndarray:
    """M = 0.5 * (I + A), entry for entry as numpy computes 0.5 * (np.eye(n) + a)."""
    m = 0.5 * a
    for i in range(a.shape[0]):
        m[i, i] = 0.5 * (1.0 + a[i, i])
    return m


@njit(cache=True)
def tv_factor_pairs(a: np.ndarray, rows_i: np.ndarray, rows_j: np.ndarray) -> np.ndarray:
    """`tv_pairs` of M = 0.5 * (I + A), its entries computed as numpy computes
    0.5 * (np.eye(n) + a): 0.5 * (1.0 + a_ii) on the diagonal, 0.5 * a_ik off it; (pairs,)."""
    out = np.empty(rows_i.shape[0], dtype=np.float64)
    for c in range(rows_i.shape[0]):
        out[c] = tv_factor_one(a, rows_i[c], rows_j[c])
    return out


@njit(cache=True)
def tv_one(x: np.ndarray, i: int, j: int) -> float:
    """The oracle's kappa_ij(X) of one pair: 0.5 * sequential left-to-right float64 sum."""
    s = 0.0
    for k in range(x.shape[1]):
        s += abs(x[i, k] - x[j, k])
    return 0.5 * s


@njit(cache=True)
def tv_factor_one(a: np.ndarray, i: int, j: int) -> float:
    """The oracle's kappa_ij(M) of one pair, M = 0.5 * (I + A) with its entries as numpy
    computes them: 0.5 * (1.0 + a_ii) on the diagonal, 0.5 * a_ik off it."""
    s = 0.0
    for k in range(a.shape[1]):
        mi = 0.5 * (1.0 + a[i, k]) if k == i else 0.5 * a[i, k]
        mj = 0.5 * (1.0 + a[j, k]) if k == j else 0.5 * a[j, k]
        s += abs(mi - mj)
    return 0.5 * s


@njit(cache=True)
def self_dominance_gap(a: np.ndarray, i: int, j: int) -> float:
    """s_ij = (A_ji - A_ii)+ + (A_ij - A_jj)+: zero iff rows i, j are mutually self-dominant."""
    return max(a[j, i] - a[i, i], 0.0) + max(a[i, j] - a[j, j], 0.0)


@njit(cache=True)
def window_of(tol: float, window: float) -> float:
    """The half-width up to which `exact_verdict`'s slack and content gap are exact: max(tol, W)."""
    return max(tol, window)


@njit(cache=True)
def sparse_rows(x: np.ndarray, factor: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (or M = 0.5 * (I + x), entries as numpy computes them, when `factor`) as compressed
    rows: (indptr (n + 1,), indices, values), nonzero entries of each row in column order."""
    n = x.shape[0]
    indptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        count = 0
        for k in range(n):
            count += (x[i, k] != 0.0) or (factor and k == i)
        indptr[i + 1] = indptr[i] + count
    indices = np.empty(indptr[n], dtype=np.int64)
    values = np.empty(indptr[n], dtype=np.float64)
    for i in range(n):
        c = indptr[i]
        for k in range(n):
            if factor and k == i:
                indices[c], values[c] = k, 0.5 * (1.0 + x[i, k])
                c += 1
            elif x[i, k] != 0.0:
                indices[c], values[c] = k, 0.5 * x[i, k] if factor else x[i, k]
                c += 1
    return indptr, indices, values


@njit(cache=True)
def tv_pairs_sparse(indptr, indices, values, rows_i, rows_j) -> np.ndarray:
    """`tv_pairs` from compressed rows, bit for bit: the oracle's sequential sum adds exact
    zeros (|0 - 0|, |v - v|) wherever neither row has a nonzero entry, and adding +0.0 leaves a
    sum >= 0 unchanged, so summing over the merged supports in column order is the same sum."""
    out = np.empty(rows_i.shape[0], dtype=np.float64)
    for c in range(rows_i.shape[0]):
        p, p_end = indptr[rows_i[c]], indptr[rows_i[c] + 1]
        r, r_end = indptr[rows_j[c]], indptr[rows_j[c] + 1]
        s = 0.0
        while p < p_end or r < r_end:
            kp = indices[p] if p < p_end else 1 << 62
            kr = indices[r] if r < r_end else 1 << 62
            if kp == kr:
                s += abs(values[p] - values[r])
                p += 1
                r += 1
            elif kp < kr:
                s += abs(values[p] - 0.0)
                p += 1
            else:
                s += abs(0.0 - values[r])
                r += 1
        out[c] = 0.5 * s
    return out


@njit(cache=True)
def is_sparse(x: np.ndarray) -> bool:
    """At most one entry in 8 is nonzero (compressed rows then pay off)."""
    nonzero = 0
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            nonzero += x[i, k] != 0.0
    return 8 * nonzero <= x.size


@njit(cache=True)
def tv_many(a: np.ndarray, rows_i: np.ndarray, rows_j: np.ndarray, factor: bool) -> np.ndarray:
    """The oracle's kappa_ij of A (or of M = 0.5 * (I + A) when `factor`) for each listed pair,
    by the cheapest exact route: per pair for few pairs, compressed rows for many pairs of a
    sparse matrix (identity, permutations, one-hot rows), else four dense pairs side by side."""
    n = a.shape[0]
    if rows_i.shape[0] <= 4 * n:
        return tv_factor_pairs(a, rows_i, rows_j) if factor else tv_pairs(a, rows_i, rows_j)
    if is_sparse(a):
        indptr, indices, values = sparse_rows(a, factor)
        return tv_pairs_sparse(indptr, indices, values, rows_i, rows_j)
    return tv_pairs(lazy_factor(a) if factor else a, rows_i, rows_j)


@njit(cache=True)
def exact_verdict(a, a_i, a_j, m_i, m_j, tol, window, special, has_special, out_f, out_i, m):
    """The exact float64 verdict of one (n >= 2, n) matrix from its candidate pairs; row m of
    out_f (b, 4): kappa, kappa_factor, slack, content_gap; of out_i (b, 5):
    holds_by_characterisation, pair_i, pair_j, attaining_pairs, attaining_special.

    Contract on the candidates (each list in row-major (i, j) order, i < j): (a_i, a_j) holds
    every pair whose oracle kappa_ij is within 2 max(tol, window) of the oracle's kappa(A) (so
    the maximiser too); (m_i, m_j) holds a pair attaining the oracle's kappa(M) and only pairs.
    Every value is the oracle's, computed in its sequential order (`characterise`).
    """
    kappa_factor = tv_many(a, m_i, m_j, True).max()
    a_tv = tv_many(a, a_i, a_j, False)
    characterise(a, a_i, a_j, a_tv, kappa_factor, tol, window, special, has_special,
                 out_f, out_i, m)


@njit(cache=True)
def characterise(a, a_i, a_j, a_tv, kappa_factor, tol, window, special, has_special,
                 out_f, out_i, m):
    """Row m of out_f, out_i from the oracle's kappa_ij (a_tv) of the kappa(A) candidates
    (`exact_verdict`'s contract) and the oracle's kappa(M). kappa = max a_tv is the oracle's;
    slack (min over pairs of the combined slack (kappa - kappa_ij)/2 + s_ij/2) and content_gap
    (min over pairs with no special token of kappa - kappa_ij; +inf when no such pair) are
    exact up to w = max(tol, window) and +inf above it, so holds_by_characterisation ==
    (slack <= tol) and attaining_special == (content_gap > tol) at every tolerance up to w.
    """
    kappa = a_tv.max()
    attaining = 0
    all_special = True
    best = np.inf
    pair_i = -1
    pair_j = -1
    content_gap = np.inf
    for c in range(a_i.shape[0]):
        i, j = a_i[c], a_j[c]
        gap = kappa - a_tv[c]
        if gap <= tol:
            attaining += 1
            all_special = all_special and (special[i] or special[j])
        if not (special[i] or special[j]):
            content_gap = min(content_gap, gap)
        slack = 0.5 * gap + 0.5 * self_dominance_gap(a, i, j)
        if slack < best:
            best = slack
            if slack <= tol:
                pair_i, pair_j = i, j
    w = window_of(tol, window)
    out_f[m, 0] = kappa
    out_f[m, 1] = kappa_factor
    out_f[m, 2] = best if best <= w else np.inf
    out_f[m, 3] = content_gap if content_gap <= w else np.inf
    out_i[m, 0] = pair_i >= 0
    out_i[m, 1] = pair_i
    out_i[m, 2] = pair_j
    out_i[m, 3] = attaining
    out_i[m, 4] = has_special and attaining > 0 and all_special


@njit(cache=True)
def no_pair(out_f, out_i, m):
    """The verdict of an n < 2 matrix (no pair): kappa = kappa(M) = 0, slack +inf, content gap
    -inf (no pair attains, so attaining_special is False at every tolerance), no pair."""
    out_f[m, 0] = 0.0
    out_f[m, 1] = 0.0
    out_f[m, 2] = np.inf
    out_f[m, 3] = -np.inf
    out_i[m, 0] = 0
    out_i[m, 1] = -1
    out_i[m, 2] = -1
    out_i[m, 3] = 0
    out_i[m, 4] = 0


@njit(cache=True)
def verify(a, screened, err, tol, window, special, has_special, out_f, out_i, m):
    """Exact float64 verdict of one (n, n) matrix from its screened kappa_ij (upper triangle,
    within err of the oracle's), written by `exact_verdict` into row m of out_f and out_i."""
    n = a.shape[0]
    if n < 2:
        no_pair(out_f, out_i, m)
        return
    # Pass 1: the screened maximum of kappa_ij(A).
    kmax = np.float32(-np.inf)
    for i in range(n):
        for j in range(i + 1, n):
            kmax = max(kmax, screened[i, j])
    # Pass 2: candidates, i.e. pairs that could attain (within 2 w) kappa(A), or attain kappa(M)
    # through its screened value m_ij = (1 + kappa_ij)/2 - s_ij/2, in exact arithmetic. m_best
    # is the running maximum of m_ij; s_ij is needed only where (1 + kappa_ij)/2 can reach it.
    w = window_of(tol, window)
    a_floor = np.float64(kmax) - (2.0 * w * (1.0 + 1e-9) + 2.0 * err)
    pairs = n * (n - 1) // 2
    a_i = np.empty(pairs, dtype=np.int32)  # candidates: a_ for kappa(A), m_ for kappa(M)
    a_j = np.empty(pairs, dtype=np.int32)
    m_i = np.empty(pairs, dtype=np.int32)
    m_j = np.empty(pairs, dtype=np.int32)
    m_hat = np.empty(pairs, dtype=np.float64)
    n_a = n_m = 0
    m_best = -np.inf
    skip_below = -np.inf  # below both floors: kappa_ij < a_floor and (1 + kappa_ij)/2 < m floor
    for i in range(n):
        for j in range(i + 1, n):
            k_hat = np.float64(screened[i, j])
            if k_hat < skip_below:
                continue
            if k_hat >= a_floor:
                a_i[n_a], a_j[n_a] = i, j
                n_a += 1
            if 0.5 * (1.0 + k_hat) >= m_best - 2.0 * err:
                mh = 0.5 * (1.0 + k_hat) - 0.5 * self_dominance_gap(a, i, j)
                if mh >= m_best - 2.0 * err:
                    m_i[n_m], m_j[n_m], m_hat[n_m] = i, j, mh
                    n_m += 1
                    m_best = max(m_best, mh)
                    skip_below = min(a_floor, 2.0 * (m_best - 2.0 * err) - 1.0) - 1e-15
    kept = 0
    for c in range(n_m):  # the running maximum only grew: drop what fell out of its window
        if m_hat[c] >= m_best - 2.0 * err:
            m_i[kept], m_j[kept] = m_i[c], m_j[c]
            kept += 1
    exact_verdict(a, a_i[:n_a], a_j[:n_a], m_i[:kept], m_j[:kept], tol, window, special,
                  has_special, out_f, out_i, m)


def check_screened(a, screened, tol, window, special, has_special):
    """Verify a (b, n, n) batch from externally screened kappa_ij (e.g. torch.cdist(p=1) / 2):
    out_f (b, 4) and out_i (b, 5) as `exact_verdict` fills them."""
    b = a.shape[0]
    out_f = np.empty((b, 4), dtype=np.float64)
    out_i = np.empty((b, 5), dtype=np.int64)
    for m in range(b):
        verify(a[m], screened[m], screen_error(a[m]), tol, window, special[m], has_special,
               out_f, out_i, m)
    return out_f, out_i


@njit(fastmath=True, cache=True)
def _tv_tile64(x: np.ndarray, i0: int, j0: int, out: np.ndarray) -> None:
    """out[i0+a, j0+b] = sum_k |x[i0+a, k] - x[j0+b, k]| in float64 for a, b in 0..3, summed in
    any order (fastmath lets LLVM vectorise over k): each difference is the oracle's own."""
    n = x.shape[1]
    a0 = x[i0]
    a1 = x[i0 + 1]
    a2 = x[i0 + 2]
    a3 = x[i0 + 3]
    b0 = x[j0]
    b1 = x[j0 + 1]
    b2 = x[j0 + 2]
    b3 = x[j0 + 3]
    s00 = s01 = s02 = s03 = 0.0
    s10 = s11 = s12 = s13 = 0.0
    s20 = s21 = s22 = s23 = 0.0
    s30 = s31 = s32 = s33 = 0.0
    for k in range(n):
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        y0, y1, y2, y3 = b0[k], b1[k], b2[k], b3[k]
        s00 += abs(x0 - y0)
        s01 += abs(x0 - y1)
        s02 += abs(x0 - y2)
        s03 += abs(x0 - y3)
        s10 += abs(x1 - y0)
        s11 += abs(x1 - y1)
        s12 += abs(x1 - y2)
        s13 += abs(x1 - y3)
        s20 += abs(x2 - y0)
        s21 += abs(x2 - y1)
        s22 += abs(x2 - y2)
        s23 += abs(x2 - y3)
        s30 += abs(x3 - y0)
        s31 += abs(x3 - y1)
        s32 += abs(x3 - y2)
        s33 += abs(x3 - y3)
    out[i0, j0], out[i0, j0 + 1], out[i0, j0 + 2], out[i0, j0 + 3] = s00, s01, s02, s03
    out[i0 + 1, j0], out[i0 + 1, j0 + 1], out[i0 + 1, j0 + 2], out[i0 + 1, j0 + 3] = (
        s10, s11, s12, s13)
    out[i0 + 2, j0], out[i0 + 2, j0 + 1], out[i0 + 2, j0 + 2], out[i0 + 2, j0 + 3] = (
        s20, s21, s22, s23)
    out[i0 + 3, j0], out[i0 + 3, j0 + 1], out[i0 + 3, j0 + 2], out[i0 + 3, j0 + 3] = (
        s30, s31, s32, s33)


@njit(cache=True)
def kappa_one(a: np.ndarray, tiles: np.ndarray, x: np.ndarray, sums: np.ndarray) -> float:
    """The oracle's kappa(A) = max_{i<j} 0.5 * (sequential float64 sum of |A_ik - A_jk|) of one
    (n, n) float64 matrix, with no assumption on its rows (kappa alone: no kappa(M), no pair).

    Screen: every pair's sum in float64, any order (`_tv_tile64`). Both it and the oracle sum
    the same n terms |fl(A_ik - A_jk)|, so each is within g = gamma_{n-1} (relative) of their
    exact sum S; a pair can attain the oracle maximum only if its screened sum is at least
    t_max (1 - g)^2 / (1 + g)^2 >= t_max (1 - 4 g). Those pairs are recomputed in the oracle's
    order. `x` (padded rows, n) and `sums` (padded, padded) are scratch buffers.
    """
    n = a.shape[0]
    if n < 2:
        return 0.0
    for i in range(n):
        for k in range(n):
            x[i, k] = a[i, k]
    for t in range(tiles.shape[0]):
        _tv_tile64(x, tiles[t, 0], tiles[t, 1], sums)
    t_max = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            t_max = max(t_max, sums[i, j])
    g = 1.01 * (n + 1) * U64
    floor = t_max * (1.0 - 5.0 * g) - 2.0**-1000  # 5 g > 4 g: room for this line's rounding
    rows_i, rows_j = pairs_at_least(sums, n, floor, count_at_least(sums, n, floor))
    return tv_pairs(a, rows_i, rows_j).max()


@njit(cache=True)
def count_at_least(values: np.ndarray, n: int, floor: float) -> int:
    """How many pairs i < j < n have float64(values[i, j]) >= floor."""
    count = 0
    for i in range(n):
        for j in range(i + 1, n):
            if np.float64(values[i, j]) >= floor:
                count += 1
    return count


@njit(cache=True)
def pairs_at_least(values: np.ndarray, n: int, floor: float, count: int):
    """(i, j) int64, row-major, of the `count` (`count_at_least`) pairs i < j < n with
    float64(values[i, j]) >= floor."""
    rows_i = np.empty(count, dtype=np.int64)
    rows_j = np.empty(count, dtype=np.int64)
    c = 0
    for i in range(n):
        for j in range(i + 1, n):
            if np.float64(values[i, j]) >= floor:
                rows_i[c], rows_j[c] = i, j
                c += 1
    return rows_i, rows_j


@njit(parallel=True, cache=True)
def kappa_over_matrices(a, tiles, threads):
    """`kappa_one` of each (n, n) matrix of a (b, n, n) float64 batch, matrices spread over
    `threads`, each with its own buffers; (b,) float64."""
    b, n = a.shape[0], a.shape[1]
    rows = -(-n // TILE) * TILE
    out = np.empty(b, dtype=np.float64)
    for t in prange(threads):
        x = np.zeros((rows, n), dtype=np.float64)  # (padded row, column); padding rows stay 0
        sums = np.empty((rows, rows), dtype=np.float64)  # (row i, row j)
        for m in range(t, b, threads):
            out[m] = kappa_one(a[m], tiles, x, sums)
    return out


# --- The whole rollout's kappa, screened in float32 (speed-stage) ---------------------------

CANDIDATES_PER_ROW = 4  # beyond n * this many candidate pairs a kappa screen hands over: the
# pruned one to `kappa_one32`, `kappa_one32` to the float64 screen of `kappa_one`


@njit(cache=True)
def kappa_one32(a: np.ndarray, tiles: np.ndarray, x32: np.ndarray, out32: np.ndarray,
                x64: np.ndarray, sums: np.ndarray) -> float:
    """`kappa_one` (the oracle's kappa(A) bit for bit) screened in float32 first.

    The float32 screen (`screen_serial`, half the bytes and twice the SIMD lanes of float64)
    is within `screen_error(a)` of each exact kappa_ij, which also covers rows off 1 and the
    oracle's own rounding; every pair whose screened value is within 2 * err of the screened
    maximum can attain the oracle's maximum, and only those are recomputed in the oracle's order
    (`tv_pairs`). Where more than CANDIDATES_PER_ROW * n pairs tie that closely (near-uniform or
    identical rows), the float64 screen of `kappa_one` takes over, so ties cost what they cost
    before. `x32` (padded rows, n) float32 with zero padding rows, `out32` (padded, padded)
    float32, `x64` and `sums` as `kappa_one`'s scratch buffers.
    """
    n = a.shape[0]
    if n < 2:
        return 0.0
    fill_float32(a, x32)
    screen_serial(x32, tiles, out32)
    kmax = np.float32(-np.inf)
    for i in range(n):
        for j in range(i + 1, n):
            kmax = max(kmax, out32[i, j])
    floor = np.float64(kmax) - 2.0 * screen_error(a)
    count = count_at_least(out32, n, floor)
    if count > CANDIDATES_PER_ROW * n:
        return kappa_one(a, tiles, x64, sums)
    rows_i, rows_j = pairs_at_least(out32, n, floor, count)
    return tv_pairs(a, rows_i, rows_j).max()
