"""The 95% normal quantile the intervals use is scipy's, bit for bit."""

from scipy.stats import norm

from storage.query.statistics import Z95


def test_z95_is_scipys_quantile():
    assert Z95 == float(norm.ppf(0.975))
