"""Per-input intervals for the report (`--ci bootstrap`): a seeded cluster bootstrap over inputs
(`storage.query.bootstrap`) for every rate, trained - control difference (paired: the control saw
the same inputs) and lift over a null (the null's own binomial uncertainty included), and the
`intervals` table that sets them beside the Wilson intervals (width ratio, design effect).

Each statistic's resamples come from SeedSequence(seed, spawn_key=(what, model, token set[,
null])) with names hashed by `storage.fingerprint.stable_int`: an interval does not depend on
which others are computed. A rate's resamples (what = "rate") are drawn once (`rate_resamples`)
and read by its interval, its design effect and its lift over each null (whose binomial draws
come from (lift, model, token set, null)); a paired difference draws its own (paired, model,
token set).
"""

from __future__ import annotations

from dataclasses import dataclass

import dask
import numpy as np
import pandas as pd
import xarray as xr

from storage.fingerprint import stable_int
from storage.query.bootstrap import (
    design_effect_of,
    generator,
    lift_samples,
    paired_difference_interval,
    percentile_interval,
    ratio_resamples,
)
from storage.query.results import holds, model_names, ok
from sweep.report.nulls import simultaneous_level

CI_METHODS = ("wilson", "bootstrap")
DEFAULT_RESAMPLES = 2000
INTERVAL_COLUMNS = ["model", "token_set", "inputs", "cells", "rate", "wilson_low",
                    "wilson_high", "bootstrap_low", "bootstrap_high", "width_ratio",
                    "design_effect"]


@dataclass(frozen=True)
class Bootstrap:
    """How the report resamples: resamples per interval and the seed."""

    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def rng(self, *words: str) -> np.random.Generator:
        return generator(self.seed, [stable_int(word) for word in words])


def per_input_counts(tree: xr.DataTree, tol: float | None) -> dict[tuple[str, str], tuple]:
    """(model, token set) -> (input ids (N,), holding (N,), cells (N,)): per input, its cells
    with a verdict (layers, and heads where kept) and how many of them hold."""
    out = {}
    for model in model_names(tree):
        ds = tree[model].to_dataset()
        verdict = ok(ds)
        holding = (holds(ds, tol) & verdict).sum(("layer", "head"))
        cells = verdict.sum(("layer", "head"))
        holding, cells = dask.compute(holding, cells)
        ids = np.asarray(ds["input"].values)
        for s, token_set in enumerate(ds["token_set"].values.tolist()):
            out[(model, str(token_set))] = (ids, holding.values[:, s].astype(np.int64),
                                            cells.values[:, s].astype(np.int64))
    return out


def rate_resamples(counts: dict, how: Bootstrap) -> dict[tuple[str, str], np.ndarray]:
    """(model, token set) -> its rate's resamples, (resamples,) each, for the keys of `counts`
    (`per_input_counts`) with at least one cell: drawn once, read by every statistic of it."""
    return {key: ratio_resamples(k, m, how.resamples, how.rng("rate", *key))
            for key, (_, k, m) in counts.items() if np.sum(m) > 0}


def bootstrap_summary(summary: pd.DataFrame, samples: dict) -> pd.DataFrame:
    """`summary` with ci_low/ci_high from the cluster bootstrap over inputs (`samples`:
    `rate_resamples`)."""
    table = summary.copy()
    ends = [percentile_interval(samples[key]) if key in samples else (np.nan, np.nan)
            for key in zip(table["model"], table["token_set"], strict=True)]
    table["ci_low"], table["ci_high"] = np.array(ends, dtype=np.float64).reshape(-1, 2).T
    return table


def bootstrap_controls(controls: pd.DataFrame, counts: dict, how: Bootstrap) -> pd.DataFrame:
    """`controls` with ci_low/ci_high of the difference from the paired bootstrap: the inputs
    both models share (by input id), resampled with the same weights."""
    table = controls.copy()
    ends = []
    for r in table.to_dict("records"):
        trained, control = counts.get((r["model"], r["token_set"])), counts.get(
            (r["control"], r["token_set"]))
        if trained is None or control is None:
            ends.append((np.nan, np.nan))
            continue
        shared, a, b = np.intersect1d(trained[0], control[0], return_indices=True)
        ends.append(paired_difference_interval(
            trained[1][a], trained[2][a], control[1][b], control[2][b], how.resamples,
            how.rng("paired", r["model"], r["token_set"])) if shared.size else (np.nan, np.nan))
    table["ci_low"], table["ci_high"] = np.array(ends, dtype=np.float64).reshape(-1, 2).T
    return table


def bootstrap_head_differences(pairs: list[tuple[str, str]], counts: dict, how: Bootstrap
                               ) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(per-head model, head-mean model, token set) -> the paired bootstrap interval of the
    per-head rate minus the head-mean rate over the inputs both hold (`findings.head_pairs`)."""
    out = {}
    for mean_model, each_model in pairs:
        for (model, token_set), each in counts.items():
            mean = counts.get((mean_model, token_set))
            if model != each_model or mean is None:
                continue
            shared, a, b = np.intersect1d(each[0], mean[0], return_indices=True)
            out[(each_model, mean_model, token_set)] = paired_difference_interval(
                each[1][a], each[2][a], mean[1][b], mean[2][b], how.resamples,
                how.rng("heads", each_model, token_set)) if shared.size else (np.nan, np.nan)
    return out


def bootstrap_lifts(nulls: pd.DataFrame, samples: dict, how: Bootstrap) -> pd.DataFrame:
    """`nulls` (`report_nulls.null_lifts`) with lift_ci_low/high from the rate's resamples over
    inputs (`samples`: `rate_resamples`) less a binomial draw of the null's count per resample,
    and lift_sim_low/high: the percentile interval of the same resamples at the Bonferroni level
    of the model's `comparisons`."""
    table = nulls.copy()
    ends = []
    for r in table.to_dict("records"):
        key = (r["model"], r["token_set"])
        if key not in samples or not r["trials"]:
            ends.append((np.nan,) * 4)
            continue
        lifts = lift_samples(samples[key], int(r["holding"]), int(r["trials"]),
                             how.rng("lift", *key, r["null"]))
        ends.append((*percentile_interval(lifts),
                     *percentile_interval(lifts, simultaneous_level(int(r["comparisons"])))))
    (table["lift_ci_low"], table["lift_ci_high"], table["lift_sim_low"],
     table["lift_sim_high"]) = np.array(ends, dtype=np.float64).reshape(-1, 4).T
    return table


def interval_table(summary: pd.DataFrame, counts: dict, samples: dict) -> pd.DataFrame:
    """Per model and token set: Wilson beside the bootstrap interval (from `summary` with
    Wilson intervals), the width ratio bootstrap / Wilson and the design effect, from the
    rate's resamples (`samples`: `rate_resamples`)."""
    rows = []
    for r in summary.to_dict("records"):
        key = (r["model"], r["token_set"])
        if key not in counts or key not in samples or not r["cells"]:
            continue
        _, k, m = counts[key]
        low, high = percentile_interval(samples[key])
        wilson = r["ci_high"] - r["ci_low"]
        rows.append([*key, int((m > 0).sum()), int(m.sum()), r["rate"], r["ci_low"],
                     r["ci_high"], low, high, (high - low) / wilson if wilson > 0 else np.nan,
                     design_effect_of(samples[key], k, m)])
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)
