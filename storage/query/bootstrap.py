"""Per-input intervals: a seeded cluster bootstrap over inputs. Pure numpy, no I/O.

A rate is a ratio of sums over inputs: r = sum_i k_i / sum_i m_i, with k_i the holding cells of
input i and m_i its cells with a verdict (its layers, and heads where kept). A resample draws N
inputs with replacement (multinomial weights w_i, sum N) and recomputes r_w = sum w k / sum w m,
so the layers of one input move together. Intervals are the 2.5% and 97.5% percentiles
(numpy's default linear interpolation) of the resampled statistic.

- `paired`: trained - control on the same inputs (aligned by the caller) takes the same weights
  for both, so what the inputs share cancels.
- `lift` over a null: the null's trials are independent draws; its own uncertainty enters as
  a parametric bootstrap of its count (binomial(T, p_null) / T per resample), subtracted from
  the rate's resamples (the report draws a rate's resamples once and reads its interval, its
  design effect and its lift over every null from them: `sweep.report.intervals`).
- Seeds: a statistic's weights come from SeedSequence(seed, spawn_key=key) with a key the
  caller derives from names (`storage.fingerprint.stable_int`), so an interval does not depend on
  which other intervals the report computes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LEVEL = 0.95
WEIGHT_BYTES = 1 << 26  # resample weights drawn at once (64 MiB of int64)


def generator(seed: int, key: Sequence[int]) -> np.random.Generator:
    """The generator of one statistic's resamples."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=tuple(key)))


def _weighted_sums(values: Sequence[np.ndarray], resamples: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
    """Per resample, sum_i w_i v_i for each of `values` ((N,) each), the same multinomial
    weights w (sum N, equal probabilities) for all of them; (resamples,) float64 each."""
    n = values[0].shape[0]
    out = [np.empty(resamples, dtype=np.float64) for _ in values]
    step = max(1, WEIGHT_BYTES // (8 * max(n, 1)))
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in values], axis=1)  # (input, v)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=stop - start)  # (resample, input)
        sums = weights @ stacked  # (resample, value)
        for j, target in enumerate(out):
            target[start:stop] = sums[:, j]
    return out


def ratio_resamples(holding: np.ndarray, cells: np.ndarray, resamples: int,
                    rng: np.random.Generator) -> np.ndarray:
    """(resamples,) resampled rates sum w k / sum w m over inputs ((N,) counts each); NaN where a
    resample drew no cell."""
    k, m = _weighted_sums([holding, cells], resamples, rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m > 0, k / np.where(m > 0, m, 1.0), np.nan)


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The (1 - level)/2 and (1 + level)/2 percentiles of the finite samples; NaN if none."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return np.nan, np.nan
    low, high = np.percentile(finite, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def rate_interval(holding: np.ndarray, cells: np.ndarray, resamples: int,
                  rng: np.random.Generator) -> tuple[float, float]:
    """95% cluster-bootstrap interval of sum k / sum m over inputs."""
    if np.sum(cells) <= 0:
        return np.nan, np.nan
    return percentile_interval(ratio_resamples(holding, cells, resamples, rng))


def paired_difference_interval(holding: np.ndarray, cells: np.ndarray,
                               control_holding: np.ndarray, control_cells: np.ndarray,
                               resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """95% interval of rate - control rate over the same N inputs (row i of every array is the
    same input), both resampled with the same weights."""
    if np.sum(cells) <= 0 or np.sum(control_cells) <= 0:
        return np.nan, np.nan
    k, m, kc, mc = _weighted_sums([holding, cells, control_holding, control_cells], resamples,
                                  rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = k / m - kc / mc
    return percentile_interval(diff)


def lift_samples(rates: np.ndarray, null_holding: int, null_trials: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Resampled lifts rate - null rate: `rates` (the rate's resamples, `ratio_resamples`)
    less the null's rate by a binomial(null_trials, its rate) draw per resample from `rng` (its
    trials are independent). Empty when the null has no trial."""
    if null_trials <= 0:
        return np.empty(0, dtype=np.float64)
    nulls = rng.binomial(null_trials, null_holding / null_trials, size=rates.shape[0])
    return rates - nulls / null_trials


def lift_interval(holding: np.ndarray, cells: np.ndarray, null_holding: int, null_trials: int,
                  resamples: int, rng: np.random.Generator,
                  level: float = LEVEL) -> tuple[float, float]:
    """The `level` (95%) percentile interval of the lift over a null: the rate's resamples
    (`ratio_resamples`), then the null's draws (`lift_samples`), both from `rng`."""
    if np.sum(cells) <= 0:
        return np.nan, np.nan
    rates = ratio_resamples(holding, cells, resamples, rng)
    return percentile_interval(lift_samples(rates, null_holding, null_trials, rng), level)


def design_effect(holding: np.ndarray, cells: np.ndarray, resamples: int,
                  rng: np.random.Generator) -> float:
    """Bootstrap variance of the rate over the binomial variance p(1 - p)/M of M independent
    cells (M = sum m): 1 when cells act independently, above 1 when an input's cells move
    together, below 1 when inputs are more alike than independent cells (layers as strata).
    NaN when p is 0 or 1 or there is no cell."""
    if float(np.sum(cells)) <= 0:
        return np.nan
    return design_effect_of(ratio_resamples(holding, cells, resamples, rng), holding, cells)


def design_effect_of(samples: np.ndarray, holding: np.ndarray, cells: np.ndarray) -> float:
    """`design_effect` from the rate's resamples already drawn (`ratio_resamples`)."""
    total = float(np.sum(cells))
    p = float(np.sum(holding)) / total if total > 0 else np.nan
    if not 0.0 < p < 1.0:
        return np.nan
    return float(np.nanvar(samples, ddof=1) / (p * (1 - p) / total))
