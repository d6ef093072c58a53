"""The report's trained-vs-control table: each model beside its random-init control.

Per model with a control in the store (`sweep.config.controls.control_pairs`) and per token set:
both holding rates (holding / input-layer pairs with a verdict), their difference d = rate -
control_rate, and a 95% interval for d by Newcombe's hybrid score method (Newcombe 1998,
method 10) from the two 95% Wilson intervals (l1, u1) and (l2, u2):

    ci_low  = d - sqrt((rate - l1)^2 + (u2 - control_rate)^2)
    ci_high = d + sqrt((u1 - rate)^2 + (control_rate - l2)^2)

Like the headline's Wilson intervals it treats input-layer pairs as independent trials: it
ignores that the layers of one input are correlated (which would widen it) and that model and
control see the same inputs (a paired comparison, which would narrow it).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sweep.config.controls import control_pairs
from workers.exact.token_kinds import reading_label

COLUMNS = ["model", "control", "token_set", "holding", "cells", "rate", "control_holding",
           "control_cells", "control_rate", "difference", "ci_low", "ci_high"]


def newcombe_interval(rate: float, interval: tuple[float, float], control_rate: float,
                      control_interval: tuple[float, float]) -> tuple[float, float]:
    """95% hybrid score interval of rate - control_rate from the two rates' Wilson intervals;
    NaN ends when either rate is undefined (no verdicts yet)."""
    if not (math.isfinite(rate) and math.isfinite(control_rate)):
        return math.nan, math.nan
    (l1, u1), (l2, u2) = interval, control_interval
    d = rate - control_rate
    return (d - math.hypot(rate - l1, u2 - control_rate),
            d + math.hypot(u1 - rate, control_rate - l2))


def controls_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Trained-vs-control rows from the headline table (model, token_set, holding, cells, rate,
    ci_low, ci_high), in the summary's model order; token sets both models were tested on."""
    rows = []
    by_key = {(r["model"], r["token_set"]): r for r in summary.to_dict("records")}
    for model, control in control_pairs(dict.fromkeys(summary["model"])):
        for token_set in dict.fromkeys(summary.loc[summary["model"] == model, "token_set"]):
            trained, random = by_key.get((model, token_set)), by_key.get((control, token_set))
            if random is None:
                continue
            low, high = newcombe_interval(
                float(trained["rate"]), (trained["ci_low"], trained["ci_high"]),
                float(random["rate"]), (random["ci_low"], random["ci_high"]),
            )
            rows.append({
                "model": model, "control": control, "token_set": token_set,
                "holding": int(trained["holding"]), "cells": int(trained["cells"]),
                "rate": float(trained["rate"]), "control_holding": int(random["holding"]),
                "control_cells": int(random["cells"]), "control_rate": float(random["rate"]),
                "difference": float(trained["rate"]) - float(random["rate"]),
                "ci_low": low, "ci_high": high,
            })
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({c: np.float64 for c in ("rate", "control_rate", "difference", "ci_low",
                                                   "ci_high")})


NEWCOMBE = "95% Newcombe hybrid score interval (input-layer pairs counted as independent trials)"
PAIRED = "95% paired cluster bootstrap over the inputs both models saw"


def markdown_section(table: pd.DataFrame, interval: str = NEWCOMBE) -> list[str]:
    """The section's Markdown lines: heading, how to read it, one row per model and token set;
    `interval` says how the difference's interval was made."""
    out = ["## Controls: trained model against its random initialisation", "",
           "Holding rates of each model and of the same architecture with seeded random weights "
           "(`<model>@random-init`) on the same inputs and token sets; difference = trained - "
           f"control, {interval}.", ""]
    if table.empty:
        return [*out, "(no model with a control in this store)", ""]
    out += ["| model | control | reading | trained k/n | trained rate | control k/n | "
            "control rate | difference [95% CI] |", "|---|---|---|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        out.append(
            f"| {r['model']} | {r['control']} | {reading_label(r['token_set'])} | "
            f"{r['holding']}/{r['cells']} "
            f"| {_percent(r['rate'])} | {r['control_holding']}/{r['control_cells']} | "
            f"{_percent(r['control_rate'])} | {_points(r['difference'])} "
            f"[{_points(r['ci_low'])}, {_points(r['ci_high'])}] |"
        )
    return [*out, ""]


def _percent(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _points(value: float) -> str:
    """A difference of rates in percentage points, signed: `+12.5 pp`."""
    return "–" if not math.isfinite(value) else f"{100 * value:+.1f} pp"
