"""The equality test against a float64 brute-force oracle: bit-identical numbers, the theorem,
adversarial ties, and validation messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from storage.errors import InputError, NotStochasticError
from workers.exact import kernel
from workers.exact.equality import DEFAULT_TOL, check, validate_stochastic


def pair_tv(x: np.ndarray) -> np.ndarray:
    """The oracle's kappa_ij for all pairs: 0.5 * sequential float64 sum; (n, n)."""
    return 0.5 * np.cumsum(np.abs(x[:, None, :] - x[None, :, :]), axis=2)[:, :, -1]


def oracle(a: np.ndarray, tol: float = DEFAULT_TOL, special: np.ndarray | None = None) -> dict:
    """The brute force of one validated float64 (n, n) matrix, by the definitions."""
    n = a.shape[0]
    m = 0.5 * (np.eye(n) + a)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    tv_a, tv_m = pair_tv(a), pair_tv(m)
    kappa = float(tv_a[upper].max()) if n > 1 else 0.0
    kappa_factor = float(tv_m[upper].max()) if n > 1 else 0.0
    bound = 0.5 * (1.0 + kappa)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    attaining = [(i, j) for i, j in pairs if kappa - tv_a[i, j] <= tol]
    slack = {
        (i, j): 0.5 * (kappa - tv_a[i, j])
        + 0.5 * (max(a[j, i] - a[i, i], 0.0) + max(a[i, j] - a[j, j], 0.0))
        for i, j in pairs
    }
    ok = sorted((c, p) for p, c in slack.items() if c <= tol)
    return {
        "kappa": kappa,
        "kappa_factor": kappa_factor,
        "bound": bound,
        "margin": bound - kappa_factor,
        "holds": bound - kappa_factor <= tol,
        "holds_by_characterisation": bool(ok),
        "pair": list(ok[0][1]) if ok else None,
        "attaining_pairs": len(attaining),
        "attaining_special": special is not None
        and bool(attaining)
        and all(special[i] or special[j] for i, j in attaining),
    }


def assert_matches_oracle(a: np.ndarray, tol: float = DEFAULT_TOL, **kwargs) -> None:
    """check(a) equals the oracle on every matrix, floats compared with ==."""
    result = check(a, tol=tol, **kwargs)
    x = validate_stochastic(a)
    for m, record in enumerate(result.records()):
        expected = oracle(x[m], tol)
        assert record == {k: v for k, v in expected.items() if k != "attaining_special"}, m


def stochastic(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    a = rng.exponential(size=(b, n, n))
    return a / a.sum(axis=2, keepdims=True)


def attention_like(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """Softmax of random logits with a heavy sink column 0, as real attention has."""
    logits = rng.normal(size=(b, n, n)) * 2.0
    logits[:, :, 0] += 4.0
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


@pytest.mark.parametrize("n", [2, 5, 64, 131])
def test_screen_is_within_its_rigorous_error_bound(n):
    rng = np.random.default_rng(n)
    for a in (stochastic(rng, 1, n)[0], attention_like(rng, 1, n)[0], np.eye(n)):
        x, screened = kernel.screen_buffers(n)
        kernel.fill_float32(a, x)
        kernel.screen_parallel(x, kernel.tile_order(n), screened)
        upper = np.triu(np.ones((n, n), dtype=bool), 1)
        gap = np.abs(screened[:n, :n][upper].astype(np.float64) - pair_tv(a)[upper])
        assert gap.max() <= kernel.screen_error(a)
        assert gap.max() <= 4 * (n + 2) * 2.0**-24  # and the bound is not vacuous


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 13, 33])
def test_random_matrices_equal_the_oracle_bit_for_bit(n):
    rng = np.random.default_rng(n)
    assert_matches_oracle(stochastic(rng, 24, n))  # many small matrices: threads per matrix
    assert_matches_oracle(stochastic(rng, 2, n))  # few matrices: threads within a matrix


def test_attention_like_and_larger_matrices_equal_the_oracle():
    rng = np.random.default_rng(7)
    assert_matches_oracle(attention_like(rng, 3, 70))
    assert_matches_oracle(stochastic(rng, 1, 150))


def test_torch_screen_gives_the_same_exact_answer():
    rng = np.random.default_rng(3)
    a = np.concatenate([stochastic(rng, 3, 21), attention_like(rng, 3, 21), np.eye(21)[None]])
    via_torch, via_numba = check(a, device="cpu"), check(a)
    for name in ("kappa", "kappa_factor", "margin", "pair", "attaining_pairs"):
        np.testing.assert_array_equal(getattr(via_torch, name), getattr(via_numba, name))
    assert_matches_oracle(a, device="cpu")


def test_identity_every_pair_attains_and_the_bound_holds():
    result = check(np.eye(40))
    assert result.records() == [
        {
            "kappa": 1.0,
            "kappa_factor": 1.0,
            "bound": 1.0,
            "margin": 0.0,
            "holds": True,
            "holds_by_characterisation": True,
            "pair": [0, 1],
            "attaining_pairs": 40 * 39 // 2,
        }
    ]


def test_permutation_matrices():
    rng = np.random.default_rng(5)
    perms = np.stack([np.eye(9)[rng.permutation(9)] for _ in range(10)])
    assert_matches_oracle(perms)
    # The 3-cycle: every pair attains kappa = 1 and none is mutually self-dominant.
    cycle = np.roll(np.eye(3), 1, axis=1)
    result = check(cycle)
    assert result.kappa[0] == 1.0 and not result.holds[0] and result.pair[0].tolist() == [-1, -1]
    assert result.kappa_factor[0] == 0.5 and result.margin[0] == 0.5


def test_identical_rows_hold_with_kappa_factor_one_half():
    row = np.random.default_rng(2).dirichlet(np.ones(11))
    result = check(np.tile(row, (11, 1)))
    assert result.kappa[0] == 0.0 and result.kappa_factor[0] == 0.5 and result.holds[0]
    assert result.holds_by_characterisation[0] and result.attaining_pairs[0] == 55


def test_ties_and_duplicate_rows_equal_the_oracle():
    rng = np.random.default_rng(11)
    a = rng.integers(0, 3, size=(30, 6, 6)).astype(float) + 1e-300
    a[:, 3] = a[:, 1]  # duplicate rows
    assert_matches_oracle(a / a.sum(axis=2, keepdims=True))


def test_near_one_hot_rows_agree_on_both_verdicts():
    n = 5
    a = np.full((n, n), 1e-15 / (n - 1))
    a[np.arange(n), (np.arange(n) + 1) % n] = 1.0 - 1e-15  # mass off the diagonal
    a[0] = np.full(n, 1e-15 / (n - 1))
    a[0, 0] = 1.0 - 1e-15
    a[1, 1], a[1, 2] = 1.0 - 1e-15, 1e-15 / (n - 1)
    assert_matches_oracle(a)
    result = check(a)
    assert result.disagreements == 0


def test_block_diagonal_matrix():
    rng = np.random.default_rng(8)
    a = np.zeros((10, 10))
    a[:4, :4] = stochastic(rng, 1, 4)[0]
    a[4:, 4:] = stochastic(rng, 1, 6)[0]
    result = check(a)
    assert abs(result.kappa[0] - 1.0) < 1e-15 and result.holds[0]  # disjoint rows across blocks
    assert_matches_oracle(a)


def test_n_equals_one_has_no_pair():
    assert check(np.ones((1, 1))).records() == [
        {
            "kappa": 0.0,
            "kappa_factor": 0.0,
            "bound": 0.5,
            "margin": 0.5,
            "holds": False,
            "holds_by_characterisation": False,
            "pair": None,
            "attaining_pairs": 0,
        }
    ]


def test_n_equals_two_holds_iff_the_first_row_keeps_its_own_token():
    rng = np.random.default_rng(4)
    p, q = rng.uniform(size=400), rng.uniform(size=400)
    keep = np.abs(p - q) > 1e-9
    a = np.stack([np.stack([p, 1 - p], 1), np.stack([q, 1 - q], 1)], axis=1)[keep]
    result = check(a)
    np.testing.assert_array_equal(result.holds, a[:, 0, 0] >= a[:, 1, 0])
    assert result.disagreements == 0


def test_pairs_closer_than_float32_resolution_equal_the_oracle():
    rng = np.random.default_rng(6)
    eps = 10.0 ** rng.uniform(-9, -6, size=(4, 1, 1))
    a = (1 - eps) * np.eye(30) + eps * stochastic(rng, 4, 30)  # all kappa_ij within ~1e-6 of 1
    assert_matches_oracle(a)
    assert_matches_oracle(a, tol=1e-7)


def test_large_tolerance_counts_many_attaining_pairs():
    assert_matches_oracle(stochastic(np.random.default_rng(12), 6, 12), tol=0.2)


def test_tolerance_widens_the_verdict():
    a = np.array([[0.5, 0.5, 0.0], [0.5 + 1e-6, 0.5 - 1e-6, 0.0], [0.0, 0.0, 1.0]])
    assert_matches_oracle(a, tol=1e-3)
    assert_matches_oracle(a, tol=0.0)


def test_attaining_special_marks_sink_driven_maxima():
    a = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.5, 0.5]])  # kappa by pairs (0, *)
    assert check(a, special=np.array([True, False, False])).attaining_special.tolist() == [True]
    assert check(a, special=np.array([False, True, False])).attaining_special.tolist() == [False]
    assert check(a).attaining_special.tolist() == [False]


@settings(max_examples=150, deadline=None)
@given(
    arrays(np.int64, st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 7)),
           elements=st.integers(0, 4)),
    st.sampled_from([0.0, DEFAULT_TOL, 1e-3]),
)
def test_small_integer_matrices_full_of_ties_equal_the_oracle(counts, tol):
    n = min(counts.shape[1:])
    a = counts[:, :n, :n].astype(float)
    a[a.sum(axis=2) == 0] = 1.0
    a = a / a.sum(axis=2, keepdims=True)
    special = np.arange(n) % 2 == 0
    result = check(a, tol=tol, special=special)
    for m in range(a.shape[0]):
        expected = oracle(validate_stochastic(a)[m], tol, special)
        assert result.records()[m] == {
            k: v for k, v in expected.items() if k != "attaining_special"
        }
        assert bool(result.attaining_special[m]) == expected["attaining_special"]


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 24), st.integers(0, 2**32 - 1), st.floats(0.05, 5.0))
def test_theorem_margin_nonnegative_and_verdicts_agree(n, seed, concentration):
    a = np.random.default_rng(seed).dirichlet(np.full(n, concentration), size=(4, n))
    result = check(a)
    assert (result.margin >= -4 * n * 2.0**-53).all()
    assert result.disagreements == 0
    for m in np.flatnonzero(result.holds):  # combined slack <= tol: each part within 2 tol
        i, j = result.pair[m]
        assert a[m, i, i] >= a[m, j, i] - 2e-12 and a[m, j, j] >= a[m, i, j] - 2e-12
        assert result.kappa[m] - 0.5 * np.abs(a[m, i] - a[m, j]).sum() <= 2e-12


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.ones((2, 3)), "shape (2, 3)"),
        (np.ones((0, 3, 3)), "shape (0, 3, 3)"),
        (np.array([[0.5, np.nan], [0.5, 0.5]]), "matrix row 0 column 1 is nan"),
        (np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [np.inf, 0.0]]]), "matrix 1 row 1"),
        (np.array([[1.1, -0.1], [0.5, 0.5]]), "matrix row 0 column 1 is negative"),
        (np.array([[0.5, 0.5], [0.5, 0.4]]), "matrix row 1 sums to 0.9 (must be 1 within 0.001)"),
        (np.array([["a"]]), "dtype"),
    ],
)
def test_invalid_matrices_are_named_in_one_line(bad, message):
    with pytest.raises(NotStochasticError) as info:
        check(bad)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_rows_within_tolerance_are_renormalised_in_float64():
    a = np.array([[0.6004, 0.4], [0.3, 0.6996]], dtype=np.float32)
    x = validate_stochastic(a)
    assert x.dtype == np.float64 and x.shape == (1, 2, 2)
    np.testing.assert_allclose(x.sum(axis=2), 1.0, rtol=0, atol=1e-15)


def test_bad_tolerance_and_special_mask_are_input_errors():
    with pytest.raises(InputError, match="tolerance"):
        check(np.eye(3), tol=-1.0)
    with pytest.raises(InputError, match="special mask"):
        check(np.eye(3), special=np.ones(4, dtype=bool))
