"""The centre bound (`workers.exact.center_bound`) decides kappa only with the float64 oracle's
value, bit for bit, and gives up (-1) rather than guess; `kappa_only` takes it first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_rollout_kappa_screen import KINDS, adversarial, oracle_kappa, stochastic
from workers.exact.center_bound import centre, centre_kappa
from workers.exact.equality import kappa_only, rollout_products


def deep_rollout(rng: np.random.Generator, n: int, layers: int) -> np.ndarray:
    """The last rollout product of attention-like layers with a sink column: rows crowd around
    a common part, each with its own diagonal mass; row 0 (a CLS-like row) stands apart."""
    logits = 2.0 * rng.normal(size=(layers, n, n))
    logits[:, :, 0] += 4.0
    logits[:, np.arange(n), np.arange(n)] += 2.0
    logits[:, 0, :] *= 3.0
    a = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return rollout_products(a / a.sum(axis=-1, keepdims=True))[-1]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 60), layers=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_a_decided_kappa_is_the_oracles(n, layers, seed):
    product = rollout_products(stochastic(np.random.default_rng(seed), layers, n))[-1]
    value = centre_kappa(product, 4 * n)
    assert value == -1.0 or value == oracle_kappa(product)


@pytest.mark.parametrize("n", [31, 197])
def test_deep_rollouts_are_decided_by_the_centre_bound(n):
    for seed in range(3):
        product = deep_rollout(np.random.default_rng(seed), n, 8)
        value = centre_kappa(product, 4 * n)
        assert value >= 0.0, "the centre bound gave up on a rollout with an outlying row"
        assert value == oracle_kappa(product)
        assert kappa_only(product[None])[0] == value


def test_it_gives_up_where_rows_spread_over_the_simplex():
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(120), size=120)  # every pair about equally far apart
    assert centre_kappa(rows, 4 * 120) == -1.0
    assert kappa_only(rows[None])[0] == oracle_kappa(rows)  # the screens decide instead


@pytest.mark.parametrize("kind", KINDS)
def test_ties_are_the_oracles_or_left_to_the_screens(kind):
    for n in (2, 3, 17, 67):
        a = adversarial(kind, n, np.random.default_rng(n))
        value = centre_kappa(np.ascontiguousarray(a), 4 * n)
        assert value == -1.0 or value == oracle_kappa(a)


def test_the_centre_is_a_column_median_of_sampled_rows():
    x = np.arange(35.0)[:, None] * np.ones((35, 3))  # row r is r everywhere
    assert centre(x).tolist() == [15.0, 15.0, 15.0]  # rows 0, 3, ..., 30: the middle one
