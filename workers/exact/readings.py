"""The readings of "content tokens" beside `content` (A[C,C] renormalised), and which token kinds
the pairs attaining kappa involve. Pure math, no I/O; formulas in docs/readings.md.

- `content-pairs`: kappa_C(X) = max over pairs i < j of content tokens of
  kappa_ij(X) = 0.5 * (sequential left-to-right float64 sum of |X_ik - X_jk| over ALL k), for
  X = A (the all-token matrix `check` sees on `all`) and X = M = 0.5 * (eye + A). Tight iff
  kappa_C(M) = (1 + kappa_C(A))/2. The pairwise identity
  kappa_ij(M) = (1 + kappa_ij(A))/2 - [(A_ji - A_ii)+ + (A_ij - A_jj)+]/2 holds for full rows,
  so the characterisation is `check`'s, restricted to content pairs. Every float equals the
  float64 brute force (a double loop over content pairs) bit for bit.
- `content-complement`: S = A_CC + A_CS (I - A_SS)^-1 A_SC, the chain watched only while it is on
  content tokens; stochastic, so it is tested with `check` like `content`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from storage.layout import AttainingKind, ResultStatus
from workers.exact.cells import fill_rollout, fill_verdicts
from workers.exact.center_bound import distances
from workers.exact.equality import ROW_SUM_TOL, check, restrict_layers, validate_stochastic
from workers.exact.kernel import self_dominance_gap, tv_factor_one, tv_one
from workers.exact.radius import listed_radius
from workers.exact.token_kinds import TokenKind, special_mask

U64 = 2.0**-53  # unit roundoff of float64
_SPECIAL_SPECIAL = AttainingKind.SPECIAL_SPECIAL  # a plain int for the numba kernels


@njit(cache=True)
def _pairs_one(a: np.ndarray, rows: np.ndarray, tol: float):
    """`content-pairs` of one (n, n) matrix over the pairs of `rows` (sorted token indices).

    Returns (kappa, kappa_factor, holds_by_characterisation, pair_i, pair_j, attaining_pairs,
    slack, radius); the pair (on the token axis) minimises the combined slack
    (kappa - kappa_ij)/2 + s_ij/2 among the pairs where it is <= tol (-1, -1 when none), first in
    row-major order on ties; `slack` is the least combined slack over all the pairs; `radius`
    the decision radius over the same pairs (`workers.exact.radius.listed_radius`).
    """
    m = rows.shape[0]
    n = a.shape[1]
    pairs = m * (m - 1) // 2
    ka = np.empty(pairs, dtype=np.float64)
    m_hat = np.empty(pairs, dtype=np.float64)
    c = 0
    for p in range(m):
        for q in range(p + 1, m):
            i, j = rows[p], rows[q]
            ka[c] = tv_one(a, i, j)
            # the pairwise identity, to screen M
            m_hat[c] = 0.5 * (1.0 + ka[c]) - 0.5 * self_dominance_gap(a, i, j)
            c += 1
    kappa = ka.max()
    # kappa(M): only pairs whose identity value is within twice its rounding error of the best
    # can attain the oracle's maximum; recompute those in the oracle's order.
    err = 8.0 * (n + 4) * U64
    best = m_hat.max()
    kappa_factor = -np.inf
    attaining = 0
    best_slack = np.inf
    least_slack = np.inf
    pair_i = -1
    pair_j = -1
    c = 0
    for p in range(m):
        for q in range(p + 1, m):
            i, j = rows[p], rows[q]
            if m_hat[c] >= best - 2.0 * err:
                kappa_factor = max(kappa_factor, tv_factor_one(a, i, j))
            if kappa - ka[c] <= tol:
                attaining += 1
            slack = 0.5 * (kappa - ka[c]) + 0.5 * self_dominance_gap(a, i, j)
            least_slack = min(least_slack, slack)
            if slack <= tol and slack < best_slack:
                best_slack, pair_i, pair_j = slack, i, j
            c += 1
    margin = 0.5 * (1.0 + kappa) - kappa_factor  # as `content_pairs` computes it
    radius = listed_radius(a, rows, ka, kappa, margin, tol)
    return kappa, kappa_factor, pair_i >= 0, pair_i, pair_j, attaining, least_slack, radius


@njit(cache=True)
def _pairs_stack(x: np.ndarray, rows: np.ndarray, tol: float, out_f: np.ndarray,
                 out_i: np.ndarray) -> None:
    for b in range(x.shape[0]):
        kappa, kappa_factor, holds, pair_i, pair_j, attaining, slack, radius = _pairs_one(
            x[b], rows, tol)
        out_f[b, 0], out_f[b, 1], out_f[b, 2], out_f[b, 3] = kappa, kappa_factor, slack, radius
        out_i[b, 0], out_i[b, 1], out_i[b, 2], out_i[b, 3] = holds, pair_i, pair_j, attaining


def content_pairs(x: np.ndarray, rows: np.ndarray, tol: float) -> dict[str, np.ndarray]:
    """The `content-pairs` reading of a validated float64 (b, n, n) stack over the pairs i < j
    of `rows` (sorted token indices, at least two): per matrix (b,) kappa, kappa_factor, bound,
    margin, holds (margin <= tol), holds_by_characterisation, pair_i/pair_j (token axis, -1 when
    no pair is self-dominant within the combined slack), attaining_pairs and slack (the least
    combined slack over the pairs: the characterisation holds iff it is <= tol) and radius
    (the decision radius over the same pairs)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.ndim != 1 or rows.size < 2:
        raise ValueError(f"content-pairs needs at least two content tokens, got {rows.size}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    out_f = np.empty((x.shape[0], 4), dtype=np.float64)
    out_i = np.empty((x.shape[0], 4), dtype=np.int64)
    _pairs_stack(x, rows, float(tol), out_f, out_i)
    kappa, kappa_factor = out_f[:, 0].copy(), out_f[:, 1].copy()
    bound = 0.5 * (1.0 + kappa)
    margin = bound - kappa_factor
    return {
        "kappa": kappa, "kappa_factor": kappa_factor, "bound": bound, "margin": margin,
        "holds": margin <= tol, "holds_by_characterisation": out_i[:, 0].astype(bool),
        "pair_i": out_i[:, 1].copy(), "pair_j": out_i[:, 2].copy(),
        "attaining_pairs": out_i[:, 3].copy(), "slack": out_f[:, 2].copy(),
        "radius": out_f[:, 3].copy(),
    }


def stochastic_complement(a: np.ndarray, content: np.ndarray) -> np.ndarray | None:
    """S = A_CC + A_CS (I - A_SS)^-1 A_SC for a row-stochastic float64 (n, n) `a` and a bool (n,)
    content mask C (S = its complement); (|C|, |C|) float64, or None when I - A_SS is singular.

    Solved by Gaussian elimination of the special tokens one at a time, in index order, in the
    Grassmann-Taksar-Heyman form: eliminating s maps A_ij to A_ij + A_is * (A_sj / p_s) with the
    pivot p_s = 1 - A_ss taken as the sum of row s off its diagonal over the tokens left. Every
    operation adds or multiplies non-negative numbers, so S has no negative entry and its rows
    sum to 1 up to rounding; p_s = 0 exactly when the tokens left hold a closed class of special
    tokens (I - A_SS singular), reported as None. No inverse is formed.
    """
    p = np.array(a, dtype=np.float64)  # (row, column), eliminated in place
    mask = np.asarray(content, dtype=bool)
    alive = np.ones(p.shape[0], dtype=bool)
    for s in np.flatnonzero(~mask):
        alive[s] = False
        others = np.flatnonzero(alive)
        pivot = p[s, others].sum()
        if not pivot > 0.0:
            return None
        through = p[others, s]  # (others,): mass each remaining row sends to s
        p[np.ix_(others, others)] += through[:, None] * (p[s, others] / pivot)[None, :]
        p[others, s] = 0.0
    kept = np.flatnonzero(mask)
    return p[np.ix_(kept, kept)]


def complements(x: np.ndarray, content: np.ndarray,
                row_sum_tol: float = ROW_SUM_TOL) -> tuple[np.ndarray, np.ndarray]:
    """`stochastic_complement` of each matrix of a float64 (L, n, n) stack, validated as `check`
    wants: (stack (ok layers, m, m) float64 with rows renormalised, ok (L,) bool: the layers whose
    complement exists). Raises NotStochasticError if a complement's rows miss 1 by more than the
    validation tolerance."""
    parts = [stochastic_complement(layer, content) for layer in x]
    ok = np.array([part is not None for part in parts], dtype=bool)
    m = int(np.count_nonzero(content))
    if not ok.any():
        return np.empty((0, m, m), dtype=np.float64), ok
    stack = np.stack([part for part in parts if part is not None])
    return validate_stochastic(stack, name="content-complement", row_sum_tol=row_sum_tol), ok


@njit(cache=True)
def _special_classes(a: np.ndarray, kinds: np.ndarray, kappa: float, tol: float) -> int:
    """Bit mask of the classes (AttainingKind codes 1..5) of the pairs with a special token
    whose kappa_ij (the oracle's) is within tol of `kappa`. A pair whose vectorised sum
    (`center_bound.distances` from the special row), with room for both sums' rounding and this
    arithmetic, stays below kappa - tol cannot attain and skips the oracle's sequential sum; the
    others are decided by it, so the mask is the one the oracle's sums give for every pair."""
    n = a.shape[0]
    room = 8.0 * (n + 2) * U64  # > 3 gamma_{n+1} + 2u: both sums' error, the products' rounding
    floor = (kappa - tol) - room * (kappa + tol + 1.0)  # below it, kappa - kappa_ij > tol
    l1 = np.empty(n, dtype=np.float64)
    bits = 0
    for s in range(n):
        if kinds[s] == 0:
            continue
        distances(a, a[s], l1)  # l1[k]: sum_k' |a_kk' - a_sk'| in any order
        for k in range(n):
            if k == s or (kinds[k] != 0 and k < s):  # each special-special pair once
                continue
            if 0.5 * l1[k] * (1.0 + room) < floor:
                continue
            if kappa - tv_one(a, s, k) <= tol:
                bits |= 1 << (kinds[s] if kinds[k] == 0 else _SPECIAL_SPECIAL)
    return bits


def attaining_kinds(x: np.ndarray, kinds: np.ndarray, kappa: np.ndarray,
                    attaining_special: np.ndarray, tol: float) -> np.ndarray:
    """AttainingKind per matrix of a (b, n, n) stack tested by `check` with special mask
    kinds != CONTENT: `kappa` and `attaining_special` are its results, `kinds` the (n,) TokenKind
    of the rows. A content-only pair attains iff not `attaining_special`; the pairs with a special
    token (at most |S| n of them) are recomputed in the oracle's order. (b,) int8."""
    codes = np.asarray(kinds, dtype=np.int64)
    if (codes < 0).any() or (codes > TokenKind.DIST).any():
        raise ValueError(f"token kinds must be real tokens (0..{int(TokenKind.DIST)})")
    out = np.empty(x.shape[0], dtype=np.int8)
    for b in range(x.shape[0]):
        bits = _special_classes(x[b], codes, float(kappa[b]), float(tol)) if codes.any() else 0
        if not attaining_special[b]:
            bits |= 1 << AttainingKind.CONTENT_ONLY
        out[b] = _kind_of(bits)
    return out


def _kind_of(bits: int) -> int:
    """The one class a bit mask holds, MIXED for several, NONE for none."""
    if bits == 0:
        return AttainingKind.NONE
    if bits & (bits - 1):
        return AttainingKind.MIXED
    return bits.bit_length() - 1


def evaluate_content_pairs(attention: np.ndarray, token_kind: np.ndarray, tol: float,
                           out: dict[str, np.ndarray], rollout_mode: str = "every",
                           row_sum_tol: float = ROW_SUM_TOL) -> None:
    """Fill `out` (every result variable, per layer, as `evaluate_input` makes it) with the
    `content-pairs` reading of one input's (L, T, T) attention. The rows are the all-token
    matrices exactly as `all` tests them; there are no rollout values (NaN): kappa over content
    pairs is not sub-multiplicative, so the product of the layer bounds bounds nothing."""
    content = np.asarray(token_kind) == TokenKind.CONTENT
    x, _, _ = restrict_layers(attention, np.ones(content.shape, dtype=bool),  # (layer, n, n)
                              row_sum_tol=row_sum_tol)
    verdicts = content_pairs(x, np.flatnonzero(content), tol)
    for name, values in verdicts.items():
        out[name][:] = values
    out["attaining_special"][:] = False  # no pair of content tokens involves a special token
    out["content_gap"][:] = 0.0  # every pair is a content pair: the attaining ones too
    out["attaining_kind"][:] = AttainingKind.CONTENT_ONLY
    out["status"][:] = ResultStatus.OK


def evaluate_content_complement(attention: np.ndarray, token_kind: np.ndarray, tol: float,
                                out: dict[str, np.ndarray], rollout_mode: str = "every",
                                row_sum_tol: float = ROW_SUM_TOL) -> None:
    """Fill `out` with the `content-complement` reading: `check` of each layer's stochastic
    complement on the content tokens (status SINGULAR where I - A_SS is singular), pairs on the
    input's token axis, and the rollout of the complements (stopping at the first singular
    layer) -- the rollout of the complements, not the complement of the rollout."""
    content = np.asarray(token_kind) == TokenKind.CONTENT
    x, _, _ = restrict_layers(attention, np.ones(content.shape, dtype=bool),  # (layer, n, n)
                              row_sum_tol=row_sum_tol)
    stack, ok = complements(x, content, row_sum_tol)  # (ok layers, m, m)
    out["status"][:] = np.where(ok, ResultStatus.OK, ResultStatus.SINGULAR)
    if not ok.any():
        return
    kept = np.flatnonzero(content)
    result = check(stack, tol=tol, special=special_mask(token_kind)[kept], validate=False,
                   radius=True)
    fill_verdicts(out, result, ok, kept)
    out["attaining_kind"][ok] = AttainingKind.CONTENT_ONLY
    fill_rollout(out, stack, result.bound, ok, rollout_mode)


READING_EVALUATORS = {
    "content-pairs": evaluate_content_pairs,
    "content-complement": evaluate_content_complement,
}
"""The token sets evaluated here rather than by restriction (`evaluate_input` dispatches)."""
