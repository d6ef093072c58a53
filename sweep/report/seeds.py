"""The report's seed-replicate table: a trained model's rate across its training seeds.

Per model with replicates in the store (`sweep.config.seeds.seed_groups`: `<name>@seed<k>`) and per
token set: each seed's holding rate, their mean and a 95% between-seed interval (Student's t over
the seeds: mean ± t(0.975, k - 1) · sd / √k, sd with k - 1 degrees of freedom, k the number of seeds
with a rate; truncated to [0, 1]); and, where every replicate has its random-init control, each
seed's trained − control difference with the same interval. The interval describes how the
observed rate scatters from one training run to another (one seed is one draw of the split, the
initialisation and the batch order). Each seed's observed rate carries its own sampling error
(its inputs are a sample), so the spread between the observed rates contains that error: the t
interval accounts for it without adding it again (the seeds weigh equally; each seed's own
interval is the headline's or the controls'). With k seeds it has k - 1 degrees of freedom
(t(0.975, 2) = 4.30 at k = 3): wide, so an interval that includes 0 means low power, not no
effect (`sweep.report.findings`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import special

from sweep.config.controls import control_name
from sweep.config.seeds import seed_groups

COLUMNS = ["model", "token_set", "n_seeds", "seeds", "rates", "rate_mean", "ci_low", "ci_high",
           "control_rates", "differences", "difference_mean", "difference_ci_low",
           "difference_ci_high"]
LEVEL = 0.95


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of the mean of `values` (NaN values left
    out); NaN ends with fewer than two values, NaN everywhere with none. Its quantile is
    scipy's (`special.stdtrit`, what `scipy.stats.t.ppf` computes, without the 1 s import of
    scipy.stats); scipy.stats.t.interval rounds the half-width in another order (a last-bit
    difference in about 3 of 10 cases), which would change the report's numbers."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    t = float(special.stdtrit(len(x) - 1, 0.5 + LEVEL / 2))
    half = t * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def seeds_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Across-seed rows from the headline table (model, token_set, rate), in the summary's
    model order: one row per replicated model and token set."""
    rate = {(r["model"], r["token_set"]): float(r["rate"]) for r in summary.to_dict("records")}
    rows = []
    for model, replicates in seed_groups(dict.fromkeys(summary["model"])).items():
        names = [name for _, name in replicates]
        for token_set in dict.fromkeys(summary.loc[summary["model"].isin(names), "token_set"]):
            rates = [rate.get((name, token_set), math.nan) for name in names]
            controls = [rate.get((control_name(name), token_set)) for name in names]
            mean, low, high = t_interval(rates)
            low, high = _within(low, 0.0, 1.0), _within(high, 0.0, 1.0)  # a rate is in [0, 1]
            row = {"model": model, "token_set": token_set,
                   "n_seeds": sum(math.isfinite(r) for r in rates),  # with a rate, as t uses
                   "seeds": [seed for seed, _ in replicates], "rates": _listed(rates),
                   "rate_mean": mean, "ci_low": low, "ci_high": high,
                   "control_rates": None, "differences": None, "difference_mean": math.nan,
                   "difference_ci_low": math.nan, "difference_ci_high": math.nan}
            if all(c is not None for c in controls):
                differences = [r - c for r, c in zip(rates, controls, strict=True)]
                d_mean, d_low, d_high = t_interval(differences)
                row.update(control_rates=_listed(controls), differences=_listed(differences),
                           difference_mean=d_mean, difference_ci_low=d_low,
                           difference_ci_high=d_high)
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS).astype(
        {c: np.float64 for c in COLUMNS if c.endswith(("_mean", "_low", "_high"))})


def markdown_section(table: pd.DataFrame) -> list[str]:
    """The section's Markdown lines: heading, how to read it, one row per model and token set."""
    out = ["## Seeds: the rate across training seeds", ""]
    if table.empty:
        return [*out, "(no model with seed replicates in this store)", ""]
    out += ["Each training seed's holding rate (`<model>@seed<k>`), their mean with a 95% "
            "between-seed t interval, and the trained - control difference across seeds "
            "(each seed against its own `@random-init` control), in percentage points.", "",
            "| model | token set | seeds | rate per seed | mean [95% CI] | "
            "difference per seed | mean difference [95% CI] |",
            "|---|---|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        per_seed = ", ".join(_percent(v) for v in r["rates"])
        differences = ("–" if r["differences"] is None else
                       ", ".join(_points(v) for v in r["differences"]))
        out.append(
            f"| {r['model']} | {r['token_set']} | {', '.join(map(str, r['seeds']))} | "
            f"{per_seed} | {_percent(r['rate_mean'])} [{_percent(r['ci_low'])}, "
            f"{_percent(r['ci_high'])}] | {differences} | {_points(r['difference_mean'])} "
            f"[{_points(r['difference_ci_low'])}, {_points(r['difference_ci_high'])}] |"
        )
    return [*out, ""]


def _within(value: float, low: float, high: float) -> float:
    """`value` clipped to [low, high]; NaN stays NaN."""
    return value if not math.isfinite(value) else min(max(value, low), high)


def _listed(values: list[float]) -> list[float | None]:
    """`values` for a JSON list: None where a value is NaN (a model with no verdict yet)."""
    return [v if math.isfinite(v) else None for v in values]


def _percent(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _points(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:+.1f} pp"
