"""The cluster bootstrap over inputs (storage/query/bootstrap.py) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from storage.query.bootstrap import (
    design_effect,
    generator,
    lift_interval,
    paired_difference_interval,
    rate_interval,
)

RESAMPLES = 4000


def rng(key=0):
    return generator(7, (key,))


def test_paired_difference_of_two_inputs_by_hand():
    # two inputs, 4 cells each; trained holds 3 and 1, control 1 and 1. The resample weights
    # are (2, 0), (1, 1), (0, 2) with probabilities 1/4, 1/2, 1/4; the difference is then
    # 3/4 - 1/4 = 1/2, 4/8 - 2/8 = 1/4, 1/4 - 1/4 = 0: each end has 25% > 2.5% of the mass,
    # so the 95% interval is [0, 1/2] exactly
    low, high = paired_difference_interval(np.array([3, 1]), np.array([4, 4]), np.array([1, 1]),
                                           np.array([4, 4]), RESAMPLES, rng())
    assert (low, high) == (0.0, 0.5)


def test_pairing_cancels_what_the_inputs_share():
    # the control is the trained model minus one holding cell on every input: the difference
    # is the same on every resample, whatever inputs it draws
    k = np.array([5, 0, 9, 2, 7])
    m = np.full(5, 10)
    low, high = paired_difference_interval(k + 1, m, k, m, RESAMPLES, rng())
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)


def test_rate_of_identical_inputs_has_no_spread_and_unequal_sizes_weigh_by_cells():
    assert rate_interval(np.full(6, 3), np.full(6, 4), RESAMPLES, rng()) == (0.75, 0.75)
    # input 0: 1/1, input 1: 0/3. Weights (2,0): 1, (1,1): 1/4, (0,2): 0 -> [0, 1]
    assert rate_interval(np.array([1, 0]), np.array([1, 3]), RESAMPLES, rng()) == (0.0, 1.0)


def test_design_effect_of_clusters_that_move_together_is_their_size():
    # 400 inputs of 6 cells each that all hold or all fail: the rate is a mean of 400
    # Bernoulli draws, its variance 6 times the binomial one of 2,400 independent cells
    holding = np.repeat([0, 6], 200)
    cells = np.full(400, 6)
    assert design_effect(holding, cells, RESAMPLES, rng()) == pytest.approx(6.0, rel=0.1)
    # every input holds exactly half its cells: no resample moves the rate
    assert design_effect(np.full(400, 3), cells, RESAMPLES, rng()) == 0.0


def test_lift_includes_the_nulls_own_uncertainty():
    holding, cells = np.full(50, 3), np.full(50, 4)  # rate 0.75 on every resample
    low, high = lift_interval(holding, cells, 50, 100, RESAMPLES, rng())
    # only the null moves: 0.75 - binomial(100, 0.5)/100, whose 95% range is 0.40..0.60
    assert low == pytest.approx(0.15, abs=0.0101) and high == pytest.approx(0.35, abs=0.0101)
    assert lift_interval(holding, cells, 50, 100, RESAMPLES, rng()) == (low, high)  # seeded


def test_no_cells_give_no_interval():
    assert all(np.isnan(rate_interval(np.zeros(3), np.zeros(3), 10, rng())))
    assert np.isnan(design_effect(np.zeros(3), np.zeros(3), 10, rng()))
