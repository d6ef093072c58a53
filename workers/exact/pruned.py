"""The exact pruned pair kernel behind `equality.check` on the CPU. Pure numba, no I/O.

Per matrix, in a few cache-resident buffers (no float64 copy of the whole batch):

1. Prepare (when validating): each row is read in its own dtype, checked (finite, >= 0, row sum
   within the tolerance of 1) and renormalised in float64 exactly as `kernel.normalise_rows` does
   (`kernel.row_sum`, then one division per entry), into a per-thread (n, n) scratch.
2. Quantise: q_ik = floor(s x_ik) as uint16 with s ~ 65280 / max row sum, rounded so that
   q_ik <= s x_ik exactly. Then sum_k min(q_ik, q_jk) <= s sum_k min(x_ik, x_jk), and every row of
   q sums to at most 65535, so 16-bit accumulators never overflow.
3. Screen: Q_ij = sum_k min(q_ik, q_jk) for all i < j, 6 x 2 row tiles of 16-bit lanes (twice the
   lanes of float32, integer pipes). It gives a rigorous upper bound on the oracle's value,
   U_ij = c0 - Q_ij / s >= kappa_ij (c0: max row sum plus the oracle's rounding), loose by at
   most about n / s (0.004 at n = 257).
4. Prune: the oracle's kappa_ij of the pair with the largest U (exactly, in its order) is a lower
   bound L on kappa(A); only pairs with U_ij >= L - 2 w can attain it (w: the tolerance window).
   Likewise for kappa(M) through m_ij = (1 + kappa_ij)/2 - s_ij/2 with the pair maximising its
   bound. On attention-like matrices a few dozen pairs survive.
5. Verify: `kernel.exact_verdict` recomputes the survivors in the oracle's sequential float64
   order, so every number equals the float64 brute force bit for bit.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, prange

from workers.exact.center_bound import centre_kappa
from workers.exact.kernel import (
    CANDIDATES_PER_ROW,
    TILE,
    U64,
    characterise,
    exact_verdict,
    is_sparse,
    kappa_one32,
    lazy_factor,
    no_pair,
    row_sum,
    self_dominance_gap,
    sparse_rows,
    tv_factor_one,
    tv_many,
    tv_one,
    tv_pairs,
    tv_pairs_sparse,
)
from workers.exact.radius import screened_radius

SCALE = 65280.0  # quantisation scale for rows summing to 1: sum_k q_ik <= 65280 (1 + 1e-3) < 2^16
LANES = 16  # columns are padded with zeros to whole 16-lane vectors
TILE_ROWS = 6  # a screen tile is 6 x 2 pairs: 12 16-bit accumulators + 8 row vectors
TILE_COLS = 2
CENTRE_RETRY = 3  # after the centre bound fails, try it again only on every third matrix


def quantised_shape(n: int) -> tuple[int, int]:
    """(rows, columns) of the uint16 copy and the screen output: padded for whole tiles."""
    return -(-n // TILE_ROWS) * TILE_ROWS + TILE_COLS, -(-n // LANES) * LANES


def buffers(n: int, validate: bool, threads: int = 1) -> tuple[np.ndarray, ...]:
    """Each thread's (x, q, screened), stacked on a leading thread axis: the float64 scratch
    for renormalised rows ((n, n), or (0, 0) when not validating), the zero-padded uint16 copy
    (its padding must stay zero: reuse it only for the same n) and the uint16 screen output."""
    rows, cols = quantised_shape(n)
    x = np.empty((threads, n, n) if validate else (threads, 0, 0), dtype=np.float64)
    q = np.zeros((threads, rows, cols), dtype=np.uint16)
    return x, q, np.empty((threads, rows, rows), dtype=np.uint16)


@njit(cache=True)
def prepare_row(a: np.ndarray, i: int, x: np.ndarray, q: np.ndarray, scale: float,
                row_sum_tol: float) -> bool:
    """x[i] = float64(a[i]) / row_sum(float64(a[i])) exactly as `kernel.normalise_rows` writes
    it, and q[i, k] = floor(float64(a[i, k]) * (scale / total)) <= s x[i, k] (two roundings up
    of at most 2^-53 each, below the 2^-50 that `scale_for` takes off s); False (x[i], q[i]
    then undefined) when an entry is not finite and >= 0 or the row sum is off 1 by more than
    row_sum_tol."""
    n = a.shape[1]
    bad = False
    for k in range(n):
        v = np.float64(a[i, k])
        bad |= not ((v >= 0.0) & (v < np.inf))
        x[i, k] = v
    if bad:
        return False
    total = row_sum(x[i])
    if abs(total - 1.0) > row_sum_tol:
        return False
    factor = scale / total
    for k in range(n):
        v = x[i, k]
        x[i, k] = v / total
        q[i, k] = np.uint16(np.int32(v * factor))
    return True


@njit(cache=True)
def quantise_row(x: np.ndarray, i: int, scale: float, q: np.ndarray) -> None:
    """q[i, k] = floor(x[i, k] * scale) for k < n; scale (just below the true s) and the
    rounding toward zero keep q[i, k] <= s x[i, k]."""
    for k in range(x.shape[1]):
        q[i, k] = np.uint16(np.int32(x[i, k] * scale))


@njit(cache=True)
def _screen_tile(q: np.ndarray, i0: int, j0: int, out: np.ndarray) -> None:
    """out[i0 + r, j0 + c] = sum_k min(q[i0 + r, k], q[j0 + c, k]) for r < 6, c < 2 in 16-bit
    lanes (exact: every row of q sums to at most 65535); 12 accumulators, LLVM vectorises k."""
    n = q.shape[1]
    a0 = q[i0]
    a1 = q[i0 + 1]
    a2 = q[i0 + 2]
    a3 = q[i0 + 3]
    a4 = q[i0 + 4]
    a5 = q[i0 + 5]
    b0 = q[j0]
    b1 = q[j0 + 1]
    z = np.uint16(0)
    s00 = s01 = s10 = s11 = s20 = s21 = z
    s30 = s31 = s40 = s41 = s50 = s51 = z
    for k in range(n):
        x0, x1, x2, x3, x4, x5 = a0[k], a1[k], a2[k], a3[k], a4[k], a5[k]
        y0, y1 = b0[k], b1[k]
        s00 = np.uint16(s00 + min(x0, y0))
        s01 = np.uint16(s01 + min(x0, y1))
        s10 = np.uint16(s10 + min(x1, y0))
        s11 = np.uint16(s11 + min(x1, y1))
        s20 = np.uint16(s20 + min(x2, y0))
        s21 = np.uint16(s21 + min(x2, y1))
        s30 = np.uint16(s30 + min(x3, y0))
        s31 = np.uint16(s31 + min(x3, y1))
        s40 = np.uint16(s40 + min(x4, y0))
        s41 = np.uint16(s41 + min(x4, y1))
        s50 = np.uint16(s50 + min(x5, y0))
        s51 = np.uint16(s51 + min(x5, y1))
    out[i0, j0], out[i0, j0 + 1] = s00, s01
    out[i0 + 1, j0], out[i0 + 1, j0 + 1] = s10, s11
    out[i0 + 2, j0], out[i0 + 2, j0 + 1] = s20, s21
    out[i0 + 3, j0], out[i0 + 3, j0 + 1] = s30, s31
    out[i0 + 4, j0], out[i0 + 4, j0 + 1] = s40, s41
    out[i0 + 5, j0], out[i0 + 5, j0 + 1] = s50, s51


@njit(cache=True)
def screen_strip(q: np.ndarray, n: int, strip: int, out: np.ndarray) -> None:
    """Screen row strip `strip` (rows strip * TILE_ROWS ...) against every row j >= its first."""
    i0 = strip * TILE_ROWS
    for j0 in range(i0, n, TILE_COLS):
        _screen_tile(q, i0, j0, out)


@njit(cache=True)
def screen_serial(q: np.ndarray, n: int, out: np.ndarray) -> None:
    """out[i, j] = sum_k min(q_ik, q_jk) for every i < j < n (uint16; other entries junk)."""
    for strip in range(-(-n // TILE_ROWS)):
        screen_strip(q, n, strip, out)


def strip_pairs(n: int) -> int:
    """How many (strip p, strip last - p) pairs `screen_parallel` runs for n rows."""
    return (-(-n // TILE_ROWS) + 1) // 2


@njit(parallel=True, cache=True)
def screen_parallel(q: np.ndarray, n: int, out: np.ndarray, lo: int, hi: int) -> None:
    """`screen_serial` of strip pairs lo <= p < hi (all: 0, `strip_pairs(n)`) over the numba
    threads: strips p and last - p together balance the triangle."""
    strips = -(-n // TILE_ROWS)
    for p in prange(lo, hi):
        screen_strip(q, n, p, out)
        if strips - 1 - p != p:
            screen_strip(q, n, strips - 1 - p, out)


@njit(cache=True)
def _row_min(row: np.ndarray, start: int, n: int) -> int:
    """min(row[start:n]) of a uint16 row (65535 when empty); LLVM vectorises it."""
    m = np.uint16(65535)
    for j in range(start, n):
        m = min(m, row[j])
    return np.int64(m)


@njit(cache=True)
def _row_count(row: np.ndarray, start: int, n: int, limit: int) -> int:
    """How many of row[start:n] (uint16) are <= limit (0 <= limit <= 65535)."""
    t = np.uint16(limit)
    c = 0
    for j in range(start, n):
        c += row[j] <= t
    return c


@njit(cache=True)
def _limit(value: float, scale: float) -> int:
    """The largest integer Q with Q / scale <= value, rounded up (generous), clipped to
    [-1, 65535]: pairs with Q_ij <= it are kept."""
    q = value * scale * (1.0 + 1e-12)
    if q < 0.0:
        return -1
    if q >= 65535.0:  # also a huge q, which int64 cannot hold (a shifted screen's large scale)
        return 65535
    return np.int64(q)


@njit(cache=True)
def select_and_verify(x, screened, scale, rmax, tol, window, special, has_special, radius,
                      out_f, out_i, out_r, m):
    """Prune and verify one (n >= 2, n) matrix x from its screen `screened` (Q_ij, i < j) of
    q <= scale * x; rmax >= every exact row sum of x. Fills row m of out_f, out_i exactly as
    `kernel.exact_verdict` defines them, and with `radius` out_r[m] (`radius_of`)."""
    a_i, a_j, m_i, m_j, row_min = select(x, screened, scale, rmax, tol, window)
    exact_verdict(x, a_i, a_j, m_i, m_j, tol, window, special, has_special, out_f, out_i, m)
    if radius:
        radius_of(x, screened, row_min, scale, rmax, tol, out_f, out_r, m)


@njit(cache=True)
def radius_of(x, screened, row_min, scale, rmax, tol, out_f, out_r, m):
    """out_r[m] = the decision radius (`workers.exact.radius.screened_radius`) of matrix m, whose
    verdict is row m of out_f, on the screen that verdict was found with; margin as `check`
    computes it (bound - kappa(M))."""
    kappa = out_f[m, 0]
    margin = 0.5 * (1.0 + kappa) - out_f[m, 1]
    out_r[m] = screened_radius(x, screened, row_min, scale, bound_constants(x.shape[0], rmax)[1],
                               kappa, margin, tol)


@njit(cache=True)
def bound_constants(n: int, rmax: float) -> tuple[float, float]:
    """(err, c0): err bounds the oracle's rounding on kappa_ij of A or of M and on s_ij; with
    c0 = rmax + 2 err + 1e-14, U_ij = c0 - Q_ij / scale >= the oracle's kappa_ij."""
    err = 4.0 * (n + 4) * U64 * rmax
    return err, rmax + 2.0 * err + 1e-14


@njit(cache=True)
def kappa_candidates(x, screened, scale, c0, w):
    """The pairs (i < j, row-major) whose upper bound U_ij = c0 - Q_ij / scale reaches the
    oracle's kappa_ij of the best-bounded pair less 2 w (so every pair within 2 w of kappa(A));
    also each row's smallest Q (`row_min`, for further selections). Returns (a_i, a_j, row_min).
    """
    n = x.shape[0]
    row_min = np.empty(n - 1, dtype=np.int64)
    q_best, bi = 1 << 20, 0
    for i in range(n - 1):
        row_min[i] = _row_min(screened[i], i + 1, n)
        if row_min[i] < q_best:
            q_best, bi = row_min[i], i
    bj = bi + 1
    while np.int64(screened[bi, bj]) != q_best:
        bj += 1
    low_a = tv_one(x, bi, bj)  # kappa(A) >= low_a: an exact lower bound
    q_a = _limit(c0 - low_a + 2.0 * w * (1.0 + 1e-9) + 1e-15, scale)  # U_ij >= low_a - 2 w
    a_i, a_j = pairs_at_most(screened, row_min, q_a)
    return a_i, a_j, row_min


@njit(cache=True)
def pairs_at_most(screened, row_min, limit):
    """(i, j) int32, row-major, of the pairs i < j whose screened Q_ij <= limit (`row_min`: each
    row's smallest Q, to skip rows with none)."""
    n = row_min.shape[0] + 1
    count = 0
    for i in range(n - 1):
        if row_min[i] <= limit:
            count += _row_count(screened[i], i + 1, n, limit)
    rows_i = np.empty(count, dtype=np.int32)
    rows_j = np.empty(count, dtype=np.int32)
    c = 0
    for i in range(n - 1):
        if row_min[i] > limit:
            continue
        row = screened[i]
        for j in range(i + 1, n):
            if np.int64(row[j]) <= limit:
                rows_i[c], rows_j[c] = i, j
                c += 1
    return rows_i, rows_j


@njit(cache=True)
def select(x, screened, scale, rmax, tol, window):
    """The candidate pairs of one (n >= 2, n) matrix x from its screen, as
    `kernel.exact_verdict` needs them: (a_i, a_j, m_i, m_j) int32, row-major order, and each
    row's smallest Q (`kappa_candidates`' row_min).

    U_ij = c0 - Q_ij / scale bounds the oracle's kappa_ij from above and
    (1 + U_ij)/2 - s_ij/2 + 2 err its kappa_ij(M); exact values of the best-bounded pairs bound
    kappa(A) and kappa(M) from below; pairs whose upper bound cannot reach them are skipped.
    """
    n = x.shape[0]
    inv = 1.0 / scale
    err, c0 = bound_constants(n, rmax)
    a_i, a_j, row_min = kappa_candidates(x, screened, scale, c0, max(tol, window))
    # The pair with the largest bound on m_ij, from the kappa(A) candidates first, then
    # wherever (1 + U_ij)/2 alone could beat it (rows by their minimum, pairs by Q).
    m_bound, mi, mj = -np.inf, a_i[0], a_j[0]
    for c in range(a_i.shape[0]):
        i, j = a_i[c], a_j[c]
        qv = np.int64(screened[i, j])
        bound = 0.5 * (1.0 + c0 - qv * inv) - 0.5 * self_dominance_gap(x, i, j)
        if bound > m_bound:
            m_bound, mi, mj = bound, i, j
    q_reach = _limit(1.0 + c0 - 2.0 * m_bound, scale)  # Q_ij above cannot beat m_bound
    for i in range(n - 1):
        if row_min[i] > q_reach:
            continue
        row = screened[i]
        for j in range(i + 1, n):
            qv = np.int64(row[j])
            if qv <= q_reach:
                bound = 0.5 * (1.0 + c0 - qv * inv) - 0.5 * self_dominance_gap(x, i, j)
                if bound > m_bound:
                    m_bound, mi, mj = bound, i, j
                    q_reach = _limit(1.0 + c0 - 2.0 * m_bound, scale)
    low_m = tv_factor_one(x, mi, mj)  # kappa(M) >= low_m
    # kappa(M) candidates: (1 + U_ij)/2 - s_ij/2 + 2 err >= low_m.
    q_m = _limit(c0 + 1.0 - 2.0 * (low_m - 2.0 * err), scale)
    m_i, m_j = pairs_at_most(screened, row_min, q_m)
    c = 0
    for k in range(m_i.shape[0]):  # of those, the pairs whose bound reaches low_m, in order
        i, j = m_i[k], m_j[k]
        bound = 0.5 * (1.0 + c0 - np.int64(screened[i, j]) * inv) - 0.5 * self_dominance_gap(
            x, i, j)
        if bound + 2.0 * err >= low_m:
            m_i[c], m_j[c] = i, j
            c += 1
    return a_i, a_j, m_i[:c], m_j[:c], row_min


SHIFT_FLOOR = 2.0**-500  # shifted_rmax's least value: identical rows would give 0 (no scale)


@njit(cache=True)
def shifted_rmax(x: np.ndarray, lo: np.ndarray) -> float:
    """lo[k] = min_i x[i, k]; returns an upper bound, at least SHIFT_FLOOR, on every exact row
    sum of z = fl(x - lo), which the screen of `quantise_shifted` is scaled by: with R_i =
    `row_sum`(x_i) (1 + 2 (n + 4) u) >= x_i's exact sum (`trusted_rmax`) and the exact sum of lo
    >= Lo = `row_sum`(lo) (1 - 2 (n + 4) u), z_i's exact sum is at most (1 + u)(R_i - Lo); the
    difference is rounded up by (1 + 4u). One pass over x."""
    n = x.shape[0]
    lo[:] = x[0]
    top = row_sum(x[0])
    for i in range(1, n):
        top = max(top, row_sum(x[i]))
        for k in range(x.shape[1]):
            lo[k] = min(lo[k], x[i, k])
    gamma = 2.0 * (n + 4) * U64
    spread = (top * (1.0 + gamma) - row_sum(lo) * (1.0 - gamma)) * (1.0 + 4.0 * U64)
    return max(SHIFT_FLOOR, spread)


@njit(cache=True)
def quantise_shifted(x: np.ndarray, lo: np.ndarray, q: np.ndarray, scale: float) -> None:
    """q[i, k] = floor(fl(x[i, k] - lo[k]) * scale) <= s z_ik, as `quantise_row` of z."""
    for i in range(x.shape[0]):
        for k in range(x.shape[1]):
            q[i, k] = np.uint16(np.int32((x[i, k] - lo[k]) * scale))


@njit(cache=True)
def shifted_candidates(x, q, screened, lo):
    """The pairs (i < j, row-major; int32) that can attain the oracle's kappa of a trusted
    (n >= 2, n) matrix x (rows nonnegative), found by the 16-bit screen of x less its column
    minima `lo` ((n,), filled here).

    kappa_ij is the same for z = x - lo (up to z's rounding), and a rollout product's rows share
    most of their mass (a nearly rank-one R_l has kappa ~ 0.01 and large column minima), so z's
    rows sum to about its spread, not 1, and the screen, scaled by 65280 / max row sum of z,
    resolves kappa_ij about 1 / that spread times finer than the screen of x: rigorously, with
    E_i = the exact sum of x_i - lo, ||x_i - x_j||_1 = E_i + E_j - 2 sum_k min(x_ik - lo_k,
    x_jk - lo_k) <= 2 rmax_z (1 + 2u) - 2 Q_ij / (s (1 + u)) (each z_ik within u of
    x_ik - lo_k; q_ik <= s z_ik), and the oracle adds at most gamma_{n+1} of its value, so
    U_ij = c0(rmax_z) - Q_ij / s (`bound_constants`: 8 (n + 4) u rmax_z + 1e-14 over rmax_z)
    bounds it; `kappa_candidates` keeps every pair whose bound reaches the exact kappa_ij of the
    best-screened pair."""
    n = x.shape[0]
    rmax = shifted_rmax(x, lo)
    scale = scale_for(rmax)
    quantise_shifted(x, lo, q, scale)
    screen_serial(q, n, screened)
    a_i, a_j, _ = kappa_candidates(x, screened, scale, bound_constants(n, rmax)[1], 0.0)
    return a_i, a_j


@njit(parallel=True, cache=True)
def kappa_over_matrices(a, qs, screens, tiles) -> np.ndarray:
    """The oracle's kappa of each matrix of a trusted float64 (b, n, n) batch (rows nonnegative,
    summing to about 1: rollout products), bit for bit, matrices spread over the threads of the
    `buffers` qs, screens; (b,) float64. The centre bound first (`workers.exact.center_bound`: rows
    crowding around a common part, as in a deep rollout, in O(n^2); after it fails, tried again
    on every CENTRE_RETRY-th matrix only); where it leaves more than CANDIDATES_PER_ROW * n
    pairs, the 16-bit screen of the matrix less its column minima (`shifted_candidates`: a
    nearly rank-one product's common part taken out) and exact pruning; where those leave more
    than that (rows that tie within the screen's resolution, about n / 65280 of the rows'
    spread), `kernel.kappa_one32` (a float32 screen with a relative error bound, then float64)
    decides. `tiles`: `kernel.tile_order(n)`."""
    b, n = a.shape[0], a.shape[1]
    threads = qs.shape[0]
    rows = -(-n // TILE) * TILE
    out = np.zeros(b, dtype=np.float64)
    for t in prange(threads):
        # the float32 screen's buffers: untouched (no page faults) unless it runs; zero padding
        x32 = np.empty((rows, n), dtype=np.float32)
        out32 = np.empty((rows, rows), dtype=np.float32)
        x64 = np.empty((rows, n), dtype=np.float64)
        sums = np.empty((rows, rows), dtype=np.float64)
        x32[n:] = 0.0
        x64[n:] = 0.0
        lo = np.empty(n)
        centred = True  # the centre bound decided this thread's last attempt
        for m in range(t, b, threads):
            if n < 2:
                continue
            x = a[m]
            if centred or (m // threads) % CENTRE_RETRY == 0:
                value = centre_kappa(x, CANDIDATES_PER_ROW * n)
                centred = value >= 0.0
                if centred:
                    out[m] = value
                    continue
            a_i, a_j = shifted_candidates(x, qs[t], screens[t], lo)
            if a_i.shape[0] <= CANDIDATES_PER_ROW * n:
                out[m] = tv_many(x, a_i, a_j, False).max()
                continue
            out[m] = kappa_one32(x, tiles, x32, out32, x64, sums)
    return out


@njit(cache=True)
def trusted_rmax(x: np.ndarray) -> float:
    """An upper bound on every exact row sum of x (row_sum plus its own rounding), at least 1."""
    n = x.shape[0]
    rmax = 1.0
    for i in range(n):
        rmax = max(rmax, row_sum(x[i]))
    return rmax * (1.0 + 2.0 * (n + 4) * U64)


@njit(cache=True)
def validated_rmax(n: int) -> float:
    """An upper bound on the exact row sums of rows renormalised by `prepare_row`: each entry
    is v / total rounded (1 + u) and total is row_sum's (relative error <= gamma_n)."""
    return 1.0 + 2.0 * (n + 4) * U64


@njit(cache=True)
def scale_for(rmax: float) -> float:
    """The quantisation scale, just below SCALE / rmax so that q_ik <= s x_ik after rounding."""
    return SCALE / rmax * (1.0 - 2.0**-50)


@njit(cache=True)
def prepare_matrix(a, x, q, scale, row_sum_tol) -> bool:
    """Prepare and quantise every row of one (n, n) matrix a into x and q; False on bad input."""
    for i in range(a.shape[0]):
        if not prepare_row(a, i, x, q, scale, row_sum_tol):
            return False
    return True


@njit(cache=True)
def quantise_matrix(x, q, scale) -> None:
    """quantise_row for every row of a trusted (n, n) float64 matrix x."""
    for i in range(x.shape[0]):
        quantise_row(x, i, scale, q)


@njit(parallel=True, cache=True)
def check_over_matrices(a, validate, row_sum_tol, tol, window, special, has_special, radius, xs,
                        qs, screens):
    """The exact verdict of every matrix of a (b, n, n) batch, matrices spread over the threads
    of the `buffers` xs, qs, screens (thread t takes t, t + threads, ..., with its own buffers).

    `validate`: rows are checked and renormalised (any real dtype); else a is trusted float64
    already renormalised. Returns out_f (b, 4), out_i (b, 5) (`kernel.exact_verdict`), out_r
    (b,) the decision radius with `radius` (`radius_of`; NaN without, and where n < 2) and the
    number of invalid matrices (their rows of out_* undefined: the caller raises).
    """
    b = a.shape[0]
    threads = qs.shape[0]
    out_f = np.empty((b, 4), dtype=np.float64)
    out_i = np.empty((b, 5), dtype=np.int64)
    out_r = np.full(b, np.nan)
    bad = np.zeros(threads, dtype=np.int64)
    for t in prange(threads):
        for m in range(t, b, threads):
            bad[t] += _one(a[m], validate, xs[t], qs[t], screens[t], row_sum_tol, tol, window,
                           special[m], has_special, radius, out_f, out_i, out_r, m)
    return out_f, out_i, out_r, bad.sum()


@njit(cache=True)
def check_serial(a, validate, row_sum_tol, tol, window, special, has_special, radius, xs, qs,
                 screens):
    """As `check_over_matrices` on the calling thread alone with the buffers of thread 0 (no
    parallel launch: small work)."""
    b = a.shape[0]
    out_f = np.empty((b, 4), dtype=np.float64)
    out_i = np.empty((b, 5), dtype=np.int64)
    out_r = np.full(b, np.nan)
    bad = 0
    for m in range(b):
        bad += _one(a[m], validate, xs[0], qs[0], screens[0], row_sum_tol, tol, window,
                    special[m], has_special, radius, out_f, out_i, out_r, m)
    return out_f, out_i, out_r, bad


@njit(cache=True)
def _one(a, validate, x, q, screened, row_sum_tol, tol, window, special, has_special, radius,
         out_f, out_i, out_r, m) -> int:
    """Prepare, screen and verify matrix m on one thread; 1 when its input is invalid."""
    n = a.shape[0]
    if validate:
        rmax = validated_rmax(n)
        scale = scale_for(rmax)
        if not prepare_matrix(a, x, q, scale, row_sum_tol):
            return 1
        if n < 2:
            no_pair(out_f, out_i, m)
            return 0
        screen_serial(q, n, screened)
        select_and_verify(x, screened, scale, rmax, tol, window, special, has_special, radius,
                          out_f, out_i, out_r, m)
        return 0
    if n < 2:
        no_pair(out_f, out_i, m)
        return 0
    matrix = np.asarray(a, dtype=np.float64)  # a itself: trusted input is float64
    rmax = trusted_rmax(matrix)
    scale = scale_for(rmax)
    quantise_matrix(matrix, q, scale)
    screen_serial(q, n, screened)
    select_and_verify(matrix, screened, scale, rmax, tol, window, special, has_special, radius,
                      out_f, out_i, out_r, m)
    return 0


@njit(parallel=True, cache=True)
def prepare_parallel(a, x, q, scale, row_sum_tol) -> bool:
    """`prepare_matrix` with the rows spread over the numba threads."""
    n = a.shape[0]
    ok = np.ones(n, dtype=np.bool_)
    for i in prange(n):
        ok[i] = prepare_row(a, i, x, q, scale, row_sum_tol)
    return ok.all()


CHUNK_WORK = 2e8  # float64 terms per chunk of a long check (about 0.1-0.5 s): Ctrl-C acts
# between chunks


def check_within_matrices(a, validate, row_sum_tol, tol, window, special, has_special, radius,
                          xs, qs, screens, tick=None):
    """As `check_over_matrices`, one matrix at a time with the buffers of thread 0, each stage
    spread over the numba threads and cut into chunks of about CHUNK_WORK that return to Python
    in between, so that a long check (ties everywhere at large n) can be interrupted; `tick`
    (optional) is called after every chunk (progress)."""
    tick = tick or _no_tick
    b, n = a.shape[0], a.shape[1]
    out_f = np.empty((b, 4), dtype=np.float64)
    out_i = np.empty((b, 5), dtype=np.int64)
    out_r = np.full(b, np.nan)
    x, q, screened = xs[0], qs[0], screens[0]
    bad = 0
    for m in range(b):
        if n < 2:
            if validate and not prepare_matrix(a[m], x, q, scale_for(validated_rmax(n)),
                                               row_sum_tol):
                bad += 1
            no_pair(out_f, out_i, m)
            continue
        if validate:
            rmax = validated_rmax(n)
            scale = scale_for(rmax)
            if not prepare_parallel(a[m], x, q, scale, row_sum_tol):
                bad += 1
                continue
            matrix = x
        else:
            matrix = a[m]
            rmax = trusted_rmax(matrix)
            scale = scale_for(rmax)
            quantise_matrix(matrix, q, scale)
        total = strip_pairs(n)
        step = max(1, int(CHUNK_WORK // (2 * TILE_ROWS * n * n / 4)))  # a strip pair: ~n^2/2
        for lo in range(0, total, step):
            screen_parallel(q, n, screened, lo, min(total, lo + step))
            tick()
        a_i, a_j, m_i, m_j, row_min = select(matrix, screened, scale, rmax, tol, window)
        kappa_factor = tv_chunked(matrix, m_i, m_j, True, maximum=True, tick=tick)[0]
        a_tv = tv_chunked(matrix, a_i, a_j, False, tick=tick)
        characterise(matrix, a_i, a_j, a_tv, kappa_factor, tol, window, special[m],
                     has_special, out_f, out_i, m)
        if radius:
            radius_of(matrix, screened, row_min, scale, rmax, tol, out_f, out_r, m)
            tick()
    return out_f, out_i, out_r, bad


@njit(parallel=True, cache=True)
def _tv_split(x, rows_i, rows_j, parts):
    """tv_pairs of x (dense) for the listed pairs, the list cut into `parts` spread over the
    numba threads (each pair in the oracle's order)."""
    count = rows_i.shape[0]
    out = np.empty(count, dtype=np.float64)
    for p in prange(parts):
        lo, hi = p * count // parts, (p + 1) * count // parts
        out[lo:hi] = tv_pairs(x, rows_i[lo:hi], rows_j[lo:hi])
    return out


def _no_tick() -> None:
    """No progress report."""


def tv_chunked(x: np.ndarray, rows_i: np.ndarray, rows_j: np.ndarray, factor: bool,
               maximum: bool = False, tick=_no_tick) -> np.ndarray:
    """The oracle's kappa_ij of x (or of M = 0.5 * (I + x) when `factor`) for the listed
    pairs, as `kernel.tv_many` computes them, in chunks of about CHUNK_WORK terms; with
    `maximum` only their maximum, (1,), holding one chunk at a time."""
    n, count = x.shape[0], rows_i.shape[0]
    if count <= 4 * n:
        values = tv_many(x, rows_i, rows_j, factor)
        return values.max(keepdims=True) if maximum else values
    if is_sparse(x):
        indptr, indices, entries = sparse_rows(x, factor)
        per_pair = 2.0 * indices.shape[0] / n + 1.0
        run = functools.partial(tv_pairs_sparse, indptr, indices, entries)
    else:
        dense = lazy_factor(x) if factor else x
        per_pair = float(n)
        run = functools.partial(_tv_split, dense, parts=numba.get_num_threads())
    step = max(4 * n, int(CHUNK_WORK // per_pair))
    out = np.empty(1 if maximum else count, dtype=np.float64)
    out[0] = -np.inf
    for lo in range(0, count, step):
        part = run(rows_i[lo:lo + step], rows_j[lo:lo + step])
        tick()
        if maximum:
            out[0] = max(out[0], part.max())
        else:
            out[lo:lo + step] = part
    return out
