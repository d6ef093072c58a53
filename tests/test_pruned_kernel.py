"""The pruned exact kernel (`workers.exact.pruned`) against the float64 brute-force oracle, bit for
bit, on adversarial ties; its three drivers agree; slack and content gap re-apply every verdict."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.errors import NotStochasticError
from tests.test_equality import oracle, pair_tv
from tests.test_radius import brute_radius
from workers.exact import pruned
from workers.exact.equality import (
    DEFAULT_TOL,
    PARALLEL_MIN_N,
    ROW_SUM_TOL,
    SLACK_WINDOW,
    check,
    validate_stochastic,
)

KINDS = ("dirichlet", "identity", "identical", "near_uniform", "one_hot", "permutation", "sink",
         "integer", "block")


def family(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """One (n, n) row-stochastic matrix of an adversarial family (ties, sparsity, sinks)."""
    if kind == "identity":
        return np.eye(n)
    if kind == "identical":
        return np.tile(rng.dirichlet(np.ones(n)), (n, 1))
    if kind == "near_uniform":
        a = 1.0 + rng.uniform(-1, 1, size=(n, n)) * 10.0 ** rng.uniform(-12, -3)
        return a / a.sum(axis=1, keepdims=True)
    if kind == "one_hot":
        return np.eye(n)[rng.integers(0, n, size=n)]
    if kind == "permutation":
        return np.eye(n)[rng.permutation(n)]
    if kind == "sink":
        logits = rng.normal(size=(n, n)) * 2.0
        logits[:, 0] += rng.uniform(0, 30)  # from a mild sink to one-hot on token 0
        logits[np.arange(n), np.arange(n)] += rng.uniform(0, 4)  # diagonal boost
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == "integer":
        a = rng.integers(0, 3, size=(n, n)).astype(float)
        a[a.sum(axis=1) == 0] = 1.0
        return a / a.sum(axis=1, keepdims=True)
    if kind == "block":
        a = np.zeros((n, n))
        half = n // 2
        a[:half, :half] = rng.dirichlet(np.ones(max(half, 1)), size=half)[:, :half]
        a[half:, half:] = rng.dirichlet(np.ones(n - half), size=n - half)
        return a / a.sum(axis=1, keepdims=True)
    return rng.dirichlet(np.full(n, 10.0 ** rng.uniform(-1.5, 1)), size=n)


def full_oracle(a: np.ndarray, tol: float, special: np.ndarray | None) -> dict:
    """`oracle` plus slack, content_gap and the decision radius as `EqualityResult` defines
    them (no radius, None, without a pair)."""
    expected = oracle(a, tol, special)
    n = a.shape[0]
    if n < 2:
        return expected | {"slack": np.inf, "content_gap": -np.inf, "radius": None}
    tv = pair_tv(a)
    kappa = expected["kappa"]
    mask = np.zeros(n, dtype=bool) if special is None else special
    slack, gap = np.inf, np.inf
    for i in range(n):
        for j in range(i + 1, n):
            s = 0.5 * (kappa - tv[i, j]) + 0.5 * (
                max(a[j, i] - a[i, i], 0.0) + max(a[i, j] - a[j, j], 0.0))
            slack = min(slack, s)
            if not (mask[i] or mask[j]):
                gap = min(gap, kappa - tv[i, j])
    w = max(tol, SLACK_WINDOW)
    return expected | {"slack": slack if slack <= w else np.inf,
                       "content_gap": gap if gap <= w else np.inf,
                       "radius": brute_radius(a, np.arange(n), kappa, expected["margin"],
                                              expected["holds"], tol)}


def assert_exact(a: np.ndarray, tol: float = DEFAULT_TOL, special=None, **kwargs) -> None:
    """Every field of check(a, radius=True) equals the full oracle on every matrix, floats
    with ==."""
    result = check(a, tol=tol, special=special, radius=True, **kwargs)
    x = validate_stochastic(a)
    for m in range(x.shape[0]):
        mask = None if special is None else np.broadcast_to(special, x.shape[:2])[m]
        expected = full_oracle(x[m], tol, mask)
        got = result.records()[m] | {
            "attaining_special": bool(result.attaining_special[m]),
            "slack": float(result.slack[m]),
            "content_gap": float(result.content_gap[m]),
            "radius": None if np.isnan(result.radius[m]) else float(result.radius[m]),
        }
        assert got == expected, (m, got, expected)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
    st.integers(1, 23),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.0, DEFAULT_TOL, 1e-7, 1e-3]),
)
def test_mixed_adversarial_batches_equal_the_oracle(kinds, n, seed, tol):
    rng = np.random.default_rng(seed)
    a = np.stack([family(kind, n, rng) for kind in kinds])
    special = rng.uniform(size=n) < 0.3
    assert_exact(a, tol=tol, special=special)
    assert_exact(a, tol=tol)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_tiny_matrices_of_every_family(kind, n):
    rng = np.random.default_rng(n)
    assert_exact(np.stack([family(kind, n, rng) for _ in range(3)]),
                 special=np.arange(n) == 0)


@pytest.mark.parametrize("kind", ["sink", "identity", "near_uniform", "one_hot", "dirichlet"])
def test_the_three_drivers_agree_bit_for_bit(kind):
    """One thread, threads within a matrix (parallel screen) and threads over matrices."""
    rng = np.random.default_rng(1)
    n = 170
    a = np.stack([family(kind, n, rng) for _ in range(3)])
    special = np.zeros((3, n), dtype=bool)
    special[:, 0] = True
    runs = [
        driver(a, True, ROW_SUM_TOL, DEFAULT_TOL, SLACK_WINDOW, special, True, True,
               *pruned.buffers(n, True, threads))
        for driver, threads in ((pruned.check_serial, 1), (pruned.check_within_matrices, 1),
                                (pruned.check_over_matrices, 2))
    ]
    for out_f, out_i, out_r, bad in runs[1:]:
        assert bad == 0
        np.testing.assert_array_equal(out_f, runs[0][0])
        np.testing.assert_array_equal(out_i, runs[0][1])
        np.testing.assert_array_equal(out_r, runs[0][2])
    assert_exact(a[:1], special=special[0])


def test_trusted_float64_and_float32_inputs_equal_the_oracle():
    rng = np.random.default_rng(9)
    a = np.stack([family(kind, 31, rng) for kind in ("sink", "dirichlet", "near_uniform")])
    x = validate_stochastic(a)
    for name in ("kappa", "kappa_factor", "margin", "pair", "slack", "content_gap"):
        np.testing.assert_array_equal(getattr(check(x, validate=False), name),
                                      getattr(check(a), name))
    assert_exact(a.astype(np.float32))


def test_verdicts_reapplied_from_slack_and_content_gap_match_a_fresh_check():
    rng = np.random.default_rng(4)
    a = np.stack([family(kind, 9, rng) for kind in KINDS for _ in range(3)])
    a[0] = np.array(  # margin ~1e-8: the verdict flips inside the window
        [[0.5, 0.5 - 1e-8] + [1e-8 / 7] * 7] + [np.full(9, 1 / 9)] * 8)
    special = np.arange(9) < 2
    base = check(a, special=special)
    for tol in (0.0, 1e-15, 1e-12, 1e-10, 1e-8, 3e-7, SLACK_WINDOW):
        fresh = check(a, tol=tol, special=special)
        np.testing.assert_array_equal(fresh.holds, base.margin <= tol)
        np.testing.assert_array_equal(fresh.holds_by_characterisation, base.slack <= tol)
        np.testing.assert_array_equal(fresh.attaining_special, base.content_gap > tol)


def test_sink_driven_pairs_report_an_infinite_content_gap():
    a = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.5, 0.5]])  # kappa by pairs (0, *)
    result = check(a, special=np.array([True, False, False]))
    assert result.attaining_special[0] and result.content_gap[0] == np.inf  # (1, 2): gap 1
    assert check(a).content_gap[0] == 0.0  # no mask: the attaining pair itself


@pytest.mark.parametrize("n", [40, 200])
def test_an_invalid_matrix_inside_a_batch_is_named_as_validate_names_it(n):
    rng = np.random.default_rng(0)
    a = np.stack([family("dirichlet", n, rng) for _ in range(10)])
    a[7, 3, 5] = -0.25
    with pytest.raises(NotStochasticError) as info:
        check(a)
    assert str(info.value).startswith("matrix 7 row 3 column 5 is negative")
    a[7, 3, 5], a[2, 1] = 0.0, a[2, 1] * 1.01
    with pytest.raises(NotStochasticError, match="matrix 2 row 1 sums to"):
        check(a[:3])


@pytest.mark.parametrize("kind", ["identity", "identical", "one_hot", "sink"])
def test_long_checks_in_small_chunks_give_the_same_answer(kind, monkeypatch):
    """n >= PARALLEL_MIN_N, one matrix: the chunked driver; with tiny chunks it returns to
    Python many times (screen strips, dense and sparse exact sums) and still equals the oracle."""
    n = PARALLEL_MIN_N + 5
    a = family(kind, n, np.random.default_rng(2))[None]
    whole = check(a, special=np.arange(n) < 3)
    monkeypatch.setattr(pruned, "CHUNK_WORK", 3e4)
    chunked = check(a, special=np.arange(n) < 3)
    for name in ("kappa", "kappa_factor", "pair", "attaining_pairs", "slack", "content_gap",
                 "holds_by_characterisation", "attaining_special"):
        np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name))
    if kind in ("identity", "identical"):  # every pair ties: exact sums over all pairs
        assert whole.attaining_pairs[0] == n * (n - 1) // 2


def test_identity_at_large_n_is_fast_through_sparse_exact_sums():
    n = 1500
    result = check(np.eye(n))
    assert result.records() == [{
        "kappa": 1.0, "kappa_factor": 1.0, "bound": 1.0, "margin": 0.0, "holds": True,
        "holds_by_characterisation": True, "pair": [0, 1], "attaining_pairs": n * (n - 1) // 2,
    }]


def test_a_long_check_reports_progress_per_chunk_and_returns_the_same_numbers(monkeypatch):
    """`check(progress=True)` on one large matrix ticks once per chunk of the long path (the
    bar itself appears on a terminal only, after PROGRESS_DELAY_S) and changes no number."""
    from workers.exact import equality, pruned

    ticks = []
    real = pruned.check_within_matrices

    def counting(*args):
        assert len(args) == 12 and callable(args[-1])  # the tick is passed on this path only
        return real(*args[:-1], lambda: ticks.append(1))

    monkeypatch.setattr(pruned, "CHUNK_WORK", 1e5)  # many chunks at a small n
    monkeypatch.setattr(pruned, "check_within_matrices", counting)
    a = np.eye(512)
    with_bar = equality.check(a, progress=True)
    assert len(ticks) > 4
    monkeypatch.setattr(pruned, "check_within_matrices", real)
    plain = equality.check(a)
    for name in ("kappa", "kappa_factor", "margin", "slack", "content_gap", "pair",
                 "attaining_pairs", "holds", "holds_by_characterisation"):
        np.testing.assert_array_equal(getattr(with_bar, name), getattr(plain, name))
