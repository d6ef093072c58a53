"""Token-set restriction (kept submatrix, rows renormalised, empty rows reported) and the whole
rollout (R_l = M_l ... M_1) against direct float64 computations."""

from __future__ import annotations

import numpy as np
import pytest

from storage.errors import InputError, NotStochasticError
from workers.exact.equality import (
    check,
    kappa_only,
    restrict,
    restrict_layers,
    rollout,
    validate_stochastic,
)


def stochastic(rng: np.random.Generator, *shape: int) -> np.ndarray:
    a = rng.exponential(size=shape)
    return a / a.sum(axis=-1, keepdims=True)


def test_restriction_is_the_kept_submatrix_with_rows_renormalised():
    a = stochastic(np.random.default_rng(0), 6, 6)
    keep = np.array([False, True, True, False, True, True])
    r = restrict(a, keep)
    assert r.kept.tolist() == [1, 2, 4, 5] and r.empty_rows.size == 0
    sub = a[np.ix_(r.kept, r.kept)]
    np.testing.assert_allclose(r.matrix, sub / sub.sum(axis=1, keepdims=True), rtol=1e-15)
    np.testing.assert_allclose(r.matrix.sum(axis=1), 1.0, rtol=0, atol=1e-15)


def test_a_kept_row_with_no_kept_mass_is_reported_not_divided_by_zero():
    a = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])  # row 2 only attends to 0
    r = restrict(a, np.array([False, True, True]))
    assert r.matrix is None
    assert r.empty_rows.tolist() == [2]
    assert r.kept.tolist() == [1, 2]


def test_keeping_everything_is_the_identity_restriction():
    a = stochastic(np.random.default_rng(1), 5, 5)
    r = restrict(a, np.ones(5, dtype=bool))
    np.testing.assert_allclose(r.matrix, a, rtol=1e-15)
    assert r.kept.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("keep", "message"),
    [(np.ones(4, dtype=bool), "keep mask has shape (4,)"), (np.zeros(3, dtype=bool), "no token"),
     (np.ones(3), "dtype float64")],
)
def test_bad_keep_masks_are_input_errors(keep, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        restrict(np.eye(3), keep)


def test_restrict_validates_the_matrix():
    with pytest.raises(NotStochasticError, match="row 1 sums to 0.5"):
        restrict(np.array([[1.0, 0.0], [0.25, 0.25]]), np.ones(2, dtype=bool))


def test_rollout_matches_direct_products_and_the_exact_kappa():
    layers = stochastic(np.random.default_rng(2), 5, 9, 9)  # (layer, row, column)
    kappa_rollout, bound_product = rollout(layers)
    x = validate_stochastic(layers)
    r = np.eye(9)
    expected_bounds = []
    for layer, a in enumerate(x):
        r = 0.5 * (np.eye(9) + a) @ r
        assert kappa_rollout[layer] == check(r[None], validate=False).kappa[0]
        expected_bounds.append(0.5 * (1.0 + check(a[None], validate=False).kappa[0]))
    np.testing.assert_array_equal(bound_product, np.cumprod(expected_bounds))
    # Dobrushin: the coefficient is submultiplicative, so the rollout obeys the product bound.
    assert (kappa_rollout <= bound_product + 1e-12).all()
    assert (np.diff(kappa_rollout) <= 1e-12).all()  # mixing never increases kappa


def test_rollout_of_one_layer_is_its_factor():
    a = stochastic(np.random.default_rng(3), 1, 7, 7)
    kappa_rollout, bound_product = rollout(a)
    result = check(a)
    assert kappa_rollout.tolist() == result.kappa_factor.tolist()
    assert bound_product.tolist() == result.bound.tolist()


def test_rollout_names_the_bad_layer():
    layers = np.stack([np.eye(3), np.full((3, 3), 0.5)])
    with pytest.raises(NotStochasticError, match="layer 1 row 0 sums to 1.5"):
        rollout(layers)


def oracle_kappa(x: np.ndarray) -> float:
    """max_{i<j} 0.5 * (sequential left-to-right float64 sum of |x_ik - x_jk|)."""
    n, best = x.shape[0], 0.0
    for i in range(n):
        for j in range(i + 1, n):
            s = 0.0
            for k in range(n):
                s += abs(x[i, k] - x[j, k])
            best = max(best, 0.5 * s)
    return best


def products(layers: np.ndarray) -> np.ndarray:
    factors = 0.5 * (np.eye(layers.shape[1]) + layers)
    out = factors.copy()
    for layer in range(1, len(out)):
        out[layer] = factors[layer] @ out[layer - 1]
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7, 13, 33])
def test_kappa_only_is_the_oracle_bit_for_bit_even_when_every_pair_nearly_ties(n):
    rng = np.random.default_rng(n)
    near_uniform = np.exp(rng.normal(scale=1e-3, size=(4, n, n)))
    cases = [stochastic(rng, 3, n, n), products(stochastic(rng, 6, n, n)),
             products(near_uniform / near_uniform.sum(axis=-1, keepdims=True)),
             np.full((2, n, n), 1.0 / n), np.stack([np.eye(n), np.eye(n)[::-1]])]
    for x in cases:
        x = np.ascontiguousarray(x)
        expected = np.array([oracle_kappa(m) for m in x])
        assert np.array_equal(kappa_only(x), expected)
        assert np.array_equal(kappa_only(x), check(x, validate=False).kappa)


def test_restrict_layers_equals_restrict_then_validate_layer_by_layer():
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(1, 24))
        layers = stochastic(rng, 4, n, n).astype(np.float32)
        if trial % 2:
            layers[rng.random(layers.shape) < 0.6] = 0.0  # some kept rows lose all their mass
            layers[layers.sum(axis=-1) == 0.0] = 1.0
            layers /= layers.sum(axis=-1, keepdims=True)
        # everything, a scattered set, one run of tokens (all but a leading CLS: a slice)
        keep = [np.ones(n, dtype=bool), rng.random(n) < 0.7, np.arange(n) >= 1][trial % 3]
        if not keep.any():
            continue
        stack, kept, ok = restrict_layers(layers, keep)
        one_by_one = [restrict(layer.astype(np.float64), keep) for layer in layers]
        assert ok.tolist() == [r.matrix is not None for r in one_by_one]
        assert kept.tolist() == one_by_one[0].kept.tolist()
        matrices = [r.matrix for r in one_by_one if r.matrix is not None]
        if matrices:
            expected = validate_stochastic(np.stack(matrices))
            assert stack.flags.c_contiguous and np.array_equal(stack, expected)
        else:
            assert stack.shape[0] == 0


def test_restrict_layers_raises_what_restrict_raises():
    bad = np.array([[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.25, 0.25]]])
    with pytest.raises(NotStochasticError, match="matrix row 1 sums to 0.5"):
        restrict_layers(bad, np.ones(2, dtype=bool))
    with pytest.raises(InputError, match="no token"):
        restrict_layers(bad[:1], np.zeros(2, dtype=bool))
