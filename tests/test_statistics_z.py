"""The interval statistics agree with scipy's: Z95 bit for bit, the hand-written Wilson and t
intervals to rounding (they are kept by hand so that the report's numbers stay bit-identical)."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.stats import norm

from storage.query.statistics import Z95, wilson_interval
from sweep.report.seeds import t_interval


def test_z95_is_scipys_quantile():
    assert Z95 == float(norm.ppf(0.975))


@pytest.mark.parametrize(("k", "n"), [(0, 5), (3, 5), (5, 5), (37, 1152), (500, 1000), (1, 2)])
def test_wilson_is_scipys_wilson_interval(k, n):
    ci = stats.binomtest(k, n).proportion_ci(method="wilson")
    assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_t_interval_is_scipys():
    rng = np.random.default_rng(0)
    for size in (2, 3, 6):
        x = rng.normal(size=size)
        mean, low, high = t_interval(x)
        scale = float(x.std(ddof=1)) / math.sqrt(size)
        assert (low, high) == pytest.approx(stats.t.interval(0.95, size - 1, loc=mean,
                                                             scale=scale), abs=1e-12)
