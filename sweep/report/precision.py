"""Verdicts at the data's precision: which verdicts the extraction dtype's rounding could flip.

A cell is decided at a dtype when its stored decision radius (`workers.exact.radius`: the row-l1
distance within which no stochastic perturbation of the tested matrix changes the verdict)
exceeds the bound on how far rounding the attention to that dtype moves the tested matrix:

- each attention entry rounded to the dtype carries a relative error <= eta = u (unit roundoff:
  float32 2^-24, float16 2^-11, bfloat16 2^-8), so a row moves by <= u in l1 before the test
  renormalises it and the renormalised (or restricted and renormalised) row by
  <= epsilon = 2 eta / (1 - eta);
- `content-complement` eliminates each special token with sums, products and one quotient of
  non-negative numbers: one elimination turns a relative error eta into
  (1 + eta)^2 / (1 - eta) - 1, applied once per special token (n_tokens - n_kept times).

The relative bound holds in each dtype's normal range: float16 entries below 2^-14 round with an
absolute error up to 2^-25 that epsilon does not cover (docs/readings.md), so a float16 verdict
whose radius lies just above epsilon may still be flipped by that rounding.

Direction: the radius is a lower bound of the distance to the nearest verdict change, so every
verdict that rounding the entries to the dtype flips has radius <= epsilon: `undecided` is an
UPPER bound on what that rounding flips (many undecided verdicts do not flip). It bounds nothing,
in either direction, for a model run in the dtype, whose forward pass rounds every intermediate
and can move a row by more than epsilon: `sweep precision` (`sweep.report.precision_flips`) measures
those flips (the default sweep: MiniLM 0 of 1,152 verdicts flip in bfloat16 against 162
undecided; ft-cancer 18-24% against 99-100%).

Verdicts and radii are those stored by the sweep (a re-applied `--tol` is not used here).
"""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import xarray as xr

from storage.layout import ResultStatus
from storage.query.results import model_names

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
PRECISION_COLUMNS = ["model", "token_set", "dtype", "extraction_dtype", "inputs",
                     "decided_tight", "decided_not_tight", "undecided", "rate_low", "rate_high"]


def complement_eta(u: float, eliminations: np.ndarray) -> np.ndarray:
    """Relative error of the stochastic complement's entries after `eliminations` special tokens
    are eliminated from entries each rounded with relative error <= u."""
    steps = np.asarray(eliminations, dtype=np.int64)
    eta = np.full(steps.shape, u, dtype=np.float64)
    for k in range(int(steps.max(initial=0))):
        grown = (1.0 + eta) ** 2 / (1.0 - eta) - 1.0
        eta = np.where(steps > k, grown, eta)
    return eta


def rounding_bound(dtype: str, token_set: str, eliminations: np.ndarray | int = 0) -> np.ndarray:
    """epsilon: how far (row l1) rounding attention to `dtype` can move the matrix `token_set`
    tests; `eliminations` (special tokens eliminated) matters for `content-complement` only."""
    u = UNIT_ROUNDOFF[dtype]
    steps = np.asarray(eliminations if token_set == "content-complement" else 0)
    eta = complement_eta(u, steps)
    return 2.0 * eta / (1.0 - eta)


def extraction_dtype(tree: xr.DataTree, model: str) -> str:
    """The dtype a model's attention was extracted in, from the store's resolved config (a
    control `<name>@...` shares its model's); float32 when the config does not say."""
    config = tree.attrs.get("config", {}) or {}
    models = config.get("models", {}) or {}
    # a seed replicate `<name>@seed<k>` is a model of the resolved config; a control is not
    own = models.get(model) or models.get(model.rsplit("@", 1)[0]) \
        or models.get(model.split("@")[0]) or {}
    return str(own.get("dtype") or config.get("dtype") or "float32")


def precision_table(tree: xr.DataTree) -> pd.DataFrame | None:
    """Per model, token set and dtype (float32, bfloat16, float16): how many verdicts the
    rounding to that dtype cannot flip (decided_tight, decided_not_tight), how many it could
    (undecided), and the band [rate_low, rate_high] the rate lies in if every undecided verdict
    could go either way; `extraction_dtype` marks the dtype the model was extracted in. None
    when no model stored radii (a store written before them)."""
    rows = []
    for model in model_names(tree):
        ds = tree[model].to_dataset()
        if "radius" not in ds:
            continue
        status, holds, radius, n_kept = dask.compute(
            ds["status"].data, ds["holds"].data, ds["radius"].data, ds["n_kept"].data)
        n_tokens = np.asarray(ds["n_tokens"].values)[:, None, None]  # (input, layer, head)
        own = extraction_dtype(tree, model)
        for s, token_set in enumerate(ds["token_set"].values.tolist()):
            ok = status[..., s] == ResultStatus.OK
            tight, r = holds[..., s][ok], radius[..., s][ok]
            steps = np.broadcast_to(n_tokens - n_kept[..., s], ok.shape)[ok]
            inputs = int(ok.sum())
            for dtype in UNIT_ROUNDOFF:
                decided = r > rounding_bound(dtype, token_set, steps)
                counts = (int((decided & tight).sum()), int((decided & ~tight).sum()),
                          int((~decided).sum()))
                low, high = ((counts[0] / inputs, (counts[0] + counts[2]) / inputs) if inputs
                             else (np.nan, np.nan))
                rows.append([model, token_set, dtype, dtype == own, inputs, *counts, low, high])
    if not rows:
        return None
    return pd.DataFrame(rows, columns=PRECISION_COLUMNS)


def _share(k: int, n: int) -> str:
    return "–" if n == 0 else f"{k}/{n} ({100 * k / n:.1f}%)"


def precision_markdown(table: pd.DataFrame | None) -> list[str]:
    """Markdown: per model and token set, at each dtype, decided tight / decided not tight /
    undecided, and the rate's band; the extraction dtype is marked with *."""
    if table is None:
        return ["(no decision radii in this store: it was written before them)", ""]
    lines = ["| model | token set | dtype | decided tight | decided not tight | undecided | "
             "rate band |", "|" + "---|" * 7]
    for r in table.to_dict("records"):
        band = ("–" if not r["inputs"] else
                f"[{100 * r['rate_low']:.1f}%, {100 * r['rate_high']:.1f}%]")
        dtype = r["dtype"] + (" *" if r["extraction_dtype"] else "")
        lines.append(f"| {r['model']} | {r['token_set']} | {dtype} | "
                     f"{_share(r['decided_tight'], r['inputs'])} | "
                     f"{_share(r['decided_not_tight'], r['inputs'])} | "
                     f"{_share(r['undecided'], r['inputs'])} | {band} |")
    return [*lines, ""]


PRECISION_INTRO = [
    "A verdict is decided at a dtype when its decision radius (docs/readings.md) exceeds what "
    "rounding the attention to that dtype can move the tested matrix (row l1: 2u/(1 - u), u = "
    "2^-24 float32, 2^-11 float16, 2^-8 bfloat16; compounded per eliminated special token for "
    "content-complement). The radius is a lower bound of the distance to a flip, so the "
    "undecided count is an upper bound on the verdicts that rounding flips, not a count of "
    "flips; the rate lies in the band whatever they are. What a model run in the dtype flips is "
    "measured by `sweep precision STORE --dtype DTYPE`. * marks the dtype the model was "
    "extracted in.", ""]
