"""The Monte Carlo baseline: reproducible per (n, trials, seed), chunk-independent, and sane."""

from __future__ import annotations

import numpy as np
import pytest

from storage.errors import InputError
from workers.nulls.baseline import (
    BLOCK,
    baseline_blocks,
    draw_uniform_stochastic,
    holding_in_blocks,
    run_baseline,
    wilson_interval,
)


def test_draws_are_row_stochastic_with_uniform_simplex_rows():
    a = draw_uniform_stochastic(np.random.default_rng(0), 4000, 3)
    np.testing.assert_allclose(a.sum(axis=2), 1.0, rtol=0, atol=1e-15)
    # Dirichlet(1, 1, 1): each coordinate has mean 1/3 and variance 1/18.
    np.testing.assert_allclose(a.mean(axis=(0, 1)), 1 / 3, atol=0.01)
    np.testing.assert_allclose(a.var(axis=(0, 1)), 1 / 18, atol=0.005)


def test_blocks_cover_the_trials_exactly():
    assert list(baseline_blocks(2500)) == [(0, BLOCK), (1, BLOCK), (2, 500)]
    assert list(baseline_blocks(1)) == [(0, 1)]


def test_counts_do_not_depend_on_how_blocks_are_grouped():
    blocks = baseline_blocks(2300)
    whole = holding_in_blocks(5, 9, blocks)
    parts = [holding_in_blocks(5, 9, [b]) for b in reversed(list(blocks))]
    assert whole == tuple(map(sum, zip(*parts, strict=True)))
    assert run_baseline([5], 2300, 9)[0]["holding"] == whole[0]


def test_result_depends_on_the_seed_and_size_only():
    first = run_baseline([3, 6], 1500, 1)
    assert run_baseline([6], 1500, 1)[0] == first[1]  # not on the other sizes
    assert run_baseline([6], 1500, 2)[0]["holding"] != first[1]["holding"]


def test_n_two_holds_half_the_time():
    (record,) = run_baseline([2], 4000, 0)
    assert record["ci_low"] < 0.5 < record["ci_high"]
    assert record["disagreements"] == 0


@pytest.mark.parametrize("n", [8, 32, 64])
def test_moderate_sizes_hold_about_a_quarter_of_the_time(n):
    (record,) = run_baseline([n], 3000, 123)
    assert 0.22 < record["rate"] < 0.32
    assert record["ci_low"] <= record["rate"] <= record["ci_high"]


def test_progress_reports_every_trial():
    seen = []
    run_baseline([2, 3], 2100, 0, progress=seen.append)
    assert seen == [1000, 1000, 100] * 2


def test_wilson_interval_matches_the_closed_form():
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


@pytest.mark.parametrize(("sizes", "trials", "seed"), [([2], 0, 0), ([0], 10, 0), ([2], 10, -1)])
def test_bad_arguments_are_input_errors(sizes, trials, seed):
    with pytest.raises(InputError):
        run_baseline(sizes, trials, seed)
