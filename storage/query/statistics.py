"""Interval statistics for the store's readers and the report (a leaf: numpy only, so that
the config's checks, which name the nulls, load no scipy)."""

from __future__ import annotations

import numpy as np

Z95 = 1.959963984540054
"""float(scipy.stats.norm.ppf(0.975)) (tests/test_statistics_z.py checks it; the stdlib's
NormalDist differs in the last bit)."""


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% by default); exact 0 / 1 ends.

    Hand-written: scipy.stats.binomtest(k, n).proportion_ci("wilson") is the same interval but
    rounds differently in the last bits (about half of all cases), which would change stored
    report numbers, and it costs a test object per call (tests/test_statistics_z.py compares)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if k == 0 else float(centre - half)
    high = 1.0 if k == n else float(centre + half)
    return low, high
