"""Observed rates beside their size-matched nulls: null rates and the lift, with 95% intervals.

The lift of a (model, token set) over a null is observed rate - null rate. Its interval is
Newcombe's hybrid score interval for a difference of two independent proportions (Newcombe 1998,
method 10): with Wilson intervals (l1, u1) of the observed p1 and (l2, u2) of the null p2,

    low  = (p1 - p2) - sqrt((p1 - l1)^2 + (u2 - p2)^2)
    high = (p1 - p2) + sqrt((u1 - p1)^2 + (p2 - l2)^2)

Like the observed rate's own Wilson interval, it treats the input-layer cells as independent
trials (layers of one input are not); the null's draws are independent.

A model is compared with every null on every token set: `comparisons` such lifts (its family).
Beside each lift's 95% interval the table carries `lift_sim_low`/`lift_sim_high`, the same
interval at the Bonferroni level 1 - 0.05 / comparisons (z = `simultaneous_z`), so that a model's
lift intervals hold together at 95%: the findings read those (`sweep.report.findings`), the tables
print the 95% ones.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import xarray as xr

from storage.query.nulls import matched_null_table
from storage.query.results import model_names
from storage.query.statistics import Z95, wilson_interval
from workers.exact.token_kinds import reading_label

LIFT_COLUMNS = ["observed_cells", "observed_holding", "observed_rate", "lift", "lift_ci_low",
                "lift_ci_high", "comparisons", "lift_sim_low", "lift_sim_high"]
FAMILY_LEVEL = 0.95  # what a model's lift intervals hold together at


def simultaneous_z(groups: int, level: float = FAMILY_LEVEL) -> float:
    """The normal quantile that makes `groups` two-sided intervals hold together at `level`
    (Bonferroni: each at 1 - (1 - level) / groups)."""
    return float(NormalDist().inv_cdf(1 - (1 - level) / (2 * max(groups, 1))))


def simultaneous_level(groups: int, level: float = FAMILY_LEVEL) -> float:
    """Each interval's level when `groups` of them hold together at `level` (Bonferroni)."""
    return 1 - (1 - level) / max(groups, 1)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int,
                      z: float = Z95) -> tuple[float, float, float]:
    """(p1 - p2, low, high): Newcombe's hybrid score interval for a difference of two
    proportions k1/n1 - k2/n2 from the two Wilson intervals at `z` (95% by default). NaN
    everywhere when either has no trials."""
    if n1 <= 0 or n2 <= 0:
        return math.nan, math.nan, math.nan
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson_interval(k1, n1, z), wilson_interval(k2, n2, z)
    delta = p1 - p2
    return (delta, delta - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            delta + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def null_lifts(tree: xr.DataTree, summary: pd.DataFrame) -> pd.DataFrame:
    """Every model's size-matched nulls (`storage.query.nulls.matched_null_table`) with the
    observed rate of the same (model, token set) from `summary` (`holding_rates` by model and
    token set) and the lift: observed_cells, observed_holding, observed_rate, lift,
    lift_ci_low, lift_ci_high (95%), comparisons (the model's lifts with counts on both sides),
    lift_sim_low, lift_sim_high (at the Bonferroni level over them); NaN where either side has
    no count yet."""
    return add_lifts(matched_null_table(tree, model_names(tree)), summary)


def add_lifts(nulls: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """`nulls` (model, token_set, null, trials, holding, ...) with the observed counts of
    `summary` and the lifts: the columns of `null_lifts`. Pure: tables in, table out."""
    observed = summary[["model", "token_set", "cells", "holding", "rate"]].rename(
        columns={"cells": "observed_cells", "holding": "observed_holding",
                 "rate": "observed_rate"})
    table = nulls.merge(observed, on=["model", "token_set"], how="left")
    defined = [bool(np.isfinite(r["observed_cells"]) and r["observed_cells"] > 0
                    and r["trials"] > 0) for r in table.to_dict("records")]
    table["comparisons"] = pd.Series(defined, index=table.index, dtype=np.int64).groupby(
        table["model"]).transform("sum").astype(np.int64)
    lifts = [
        (*newcombe_interval(int(r["observed_holding"]), int(r["observed_cells"]),
                            int(r["holding"]), int(r["trials"])),
         *newcombe_interval(int(r["observed_holding"]), int(r["observed_cells"]),
                            int(r["holding"]), int(r["trials"]),
                            simultaneous_z(int(r["comparisons"])))[1:])
        if np.isfinite(r["observed_cells"]) else (math.nan,) * 5
        for r in table.to_dict("records")
    ]
    (table["lift"], table["lift_ci_low"], table["lift_ci_high"], table["lift_sim_low"],
     table["lift_sim_high"]) = np.array(lifts, dtype=np.float64).reshape(-1, 5).T
    for column in ("observed_cells", "observed_holding"):
        table[column] = table[column].fillna(0).astype(np.int64)
    return table


def _points(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:+.1f}"


def lift_lines(table: pd.DataFrame) -> list[str]:
    """Markdown: one row per model and token set, the observed rate, then per null its rate and
    the lift in percentage points with its 95% interval."""
    if table.empty:
        return ["(no size-matched nulls in this store)", ""]
    nulls = list(dict.fromkeys(table["null"]))
    lines = ["| model | reading | observed | " + " | ".join(nulls) + " |",
             "|" + "---|" * (3 + len(nulls))]
    for (model, token_set), group in table.groupby(["model", "token_set"], sort=False):
        by_null = {r["null"]: r for r in group.to_dict("records")}
        first = next(iter(by_null.values()))
        observed = first["observed_rate"]
        cells = [model, reading_label(str(token_set)), "–" if not math.isfinite(observed) else
                 f"{100 * observed:.1f}% ({first['observed_holding']}/{first['observed_cells']})"]
        for null in nulls:
            r = by_null.get(null)
            if r is None or not math.isfinite(r["rate"]):
                cells.append("–")
                continue
            cells.append(f"{100 * r['rate']:.1f}%, lift {_points(r['lift'])} "
                         f"[{_points(r['lift_ci_low'])}, {_points(r['lift_ci_high'])}]")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]
