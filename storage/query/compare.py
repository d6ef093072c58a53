"""Two sweep stores side by side: per model and token set (and layer), both holding rates, their
difference with a 95% bootstrap interval, and the cells whose verdict differs.

A model is compared when both stores hold a model of that name, on the token sets (and layers)
both have. Its inputs match when both stores hold the same input ids with the same content
digests (`input_digest`, written by the extraction; '' in both for a store from before them):
the interval is then the paired cluster bootstrap over those inputs
(`storage.query.bootstrap.paired_difference_interval`), else the two stores' inputs are
resampled apart (unpaired). Cells are compared one to one where an input id is in both stores
with the same digest and both cells have a verdict (status OK).
"""

from __future__ import annotations

from collections.abc import Sequence

import dask
import numpy as np
import pandas as pd
import xarray as xr
import zarr

from storage.errors import InputError
from storage.layout import MEAN_HEAD
from storage.location import StoreLike, locate
from storage.query.bootstrap import (
    paired_difference_interval,
    percentile_interval,
    ratio_resamples,
)
from storage.query.results import holds, model_names, ok, open_results

COMPARE_KEYS = ("layer",)
"""What `by` may add to (model, token_set)."""
COLUMNS = ["model", "token_set", "cells_a", "holding_a", "rate_a", "cells_b", "holding_b",
           "rate_b", "difference", "ci_low", "ci_high", "interval", "compared", "differ"]


def compare_stores(a: StoreLike, b: StoreLike, by: Sequence[str] = (),
                   storage_options: dict | None = None, resamples: int = 2000,
                   seed: int = 0) -> pd.DataFrame:
    """One row per model and token set both stores hold (and layer, with `by=("layer",)`):
    `cells_*`, `holding_*`, `rate_*` of store a and b, `difference` = rate_a - rate_b, its 95%
    bootstrap interval (`interval`: paired or unpaired), `compared` (cells tested in both, one
    to one) and `differ` (of those, the ones whose stored verdict differs).

    Raises InputError (one line) when the stores share no model and token set (or layer), or
    when a model's cells are not alike in both (`check_alike`)."""
    unknown = [key for key in by if key not in COMPARE_KEYS]
    if unknown:
        raise InputError(f"cannot compare by {unknown}: choose from {list(COMPARE_KEYS)}")
    trees = [open_results(store, storage_options) for store in (a, b)]
    digests = [_digests(store, storage_options, model_names(tree))
               for store, tree in zip((a, b), trees, strict=True)]
    rows = []
    rng = np.random.default_rng(seed)
    for model in [m for m in model_names(trees[0]) if m in model_names(trees[1])]:
        ds = [tree[model].to_dataset() for tree in trees]
        check_alike(model, *(d["head"].values.tolist() for d in ds))
        token_sets = [t for t in ds[0]["token_set"].values.tolist()
                      if t in ds[1]["token_set"].values.tolist()]
        layers = [int(n) for n in ds[0]["layer"].values if n in ds[1]["layer"].values]
        if not token_sets or ("layer" in by and not layers):
            continue
        ds = [d.sel(token_set=token_sets, layer=layers) for d in ds]
        counts = dask.compute(*[_per_input(d, "layer" in by) for d in ds])
        ids = [d["input"].values.astype(str) for d in ds]
        shared, ia, ib = np.intersect1d(ids[0], ids[1], return_indices=True)
        same = digests[0][model][ia] == digests[1][model][ib]
        paired = len(shared) == len(ids[0]) == len(ids[1]) and bool(same.all())
        ia, ib = ia[same], ib[same]
        order = np.argsort(ids[1])[np.argsort(np.argsort(ids[0]))]  # b's inputs in a's order
        differ = dask.compute(_differ(ds[0].isel(input=ia), ds[1].isel(input=ib),
                                      "layer" in by))[0]
        for s, token_set in enumerate(token_sets):
            for at, layer in (enumerate(layers) if "layer" in by else [(None, None)]):
                pick = (slice(None), s) if at is None else (slice(None), at, s)
                (ka, ma), (kb, mb) = [(c[0].values[pick], c[1].values[pick]) for c in counts]
                if paired:
                    low, high = paired_difference_interval(ka, ma, kb[order], mb[order],
                                                           resamples, rng)
                else:
                    low, high = _unpaired_interval(ka, ma, kb, mb, resamples, rng)
                compared, differing = (c.values[s] if at is None else c.values[at, s]
                                       for c in differ)
                rows.append({"model": model, "token_set": token_set,
                             **({"layer": layer} if at is not None else {}),
                             "cells_a": int(ma.sum()), "holding_a": int(ka.sum()),
                             "rate_a": _rate(ka, ma), "cells_b": int(mb.sum()),
                             "holding_b": int(kb.sum()), "rate_b": _rate(kb, mb),
                             "ci_low": low, "ci_high": high,
                             "interval": "paired" if paired else "unpaired",
                             "compared": int(compared), "differ": int(differing)})
    if not rows:
        raise InputError(f"{a} and {b} share no model and token set to compare"
                         + (" at a common layer" if "layer" in by else "") + ": a has "
                         f"{model_names(trees[0])}, b has {model_names(trees[1])}")
    table = pd.DataFrame(rows)
    table["difference"] = table["rate_a"] - table["rate_b"]
    columns = COLUMNS[:2] + (["layer"] if "layer" in by else []) + COLUMNS[2:]
    return table[columns]


def check_alike(model: str, heads_a: list, heads_b: list) -> None:
    """InputError (one line) unless `model`'s cells are of one kind in both stores: the same
    heads (`mean` for head-averaged verdicts, `0`..`H-1` for every head): a head-averaged
    verdict and a per-head one are different measurements, not one to compare."""
    if [str(h) for h in heads_a] == [str(h) for h in heads_b]:
        return
    raise InputError(f"model {model!r}: store a holds {_heads(heads_a)} and store b "
                     f"{_heads(heads_b)}; its cells are not alike, so they are not compared "
                     f"(sweep both with the same `heads` option)")


def _heads(heads: list) -> str:
    if [str(h) for h in heads] == [MEAN_HEAD]:
        return "head-averaged verdicts (heads: mean)"
    return f"the verdicts of {len(heads)} heads each (heads: each)"


def _rate(k: np.ndarray, m: np.ndarray) -> float:
    return float(k.sum() / m.sum()) if m.sum() else float("nan")


def _per_input(ds: xr.Dataset, by_layer: bool) -> tuple[xr.DataArray, xr.DataArray]:
    """Per input (and layer) and token set: holding cells and cells with a verdict."""
    over = ("head",) if by_layer else ("layer", "head")
    done = ok(ds)
    return (done & holds(ds)).sum(over), done.sum(over)


def _differ(a: xr.Dataset, b: xr.Dataset, by_layer: bool) -> tuple[xr.DataArray, xr.DataArray]:
    """Cells tested in both (inputs aligned by position) and those whose verdict differs."""
    both = ok(a).data & ok(b).data
    dims = ("input", "head") if by_layer else ("input", "layer", "head")
    axes = tuple(a["status"].dims.index(d) for d in dims)
    template = a["status"]
    keep = [d for d in template.dims if d not in dims]
    compared = xr.DataArray(both.sum(axis=axes), dims=keep)
    differing = xr.DataArray((both & (a["holds"].data != b["holds"].data)).sum(axis=axes),
                             dims=keep)
    return compared, differing


def _unpaired_interval(ka: np.ndarray, ma: np.ndarray, kb: np.ndarray, mb: np.ndarray,
                       resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    """95% interval of rate a - rate b, each store's inputs resampled on their own."""
    if ma.sum() <= 0 or mb.sum() <= 0:
        return float("nan"), float("nan")
    return percentile_interval(ratio_resamples(ka, ma, resamples, rng)
                               - ratio_resamples(kb, mb, resamples, rng))


def _digests(store: StoreLike, options: dict | None, models: list[str]) -> dict[str, np.ndarray]:
    """Each model's input digests ('' where the store has none), in its input order."""
    root = zarr.open_group(locate(store, options).zarr_store(read_only=True), mode="r",
                           use_consolidated=False)
    out = {}
    for name in models:
        group = root[name]
        n = group["input_id"].shape[0]
        stored = group.get("input_digest")
        out[name] = (np.array([str(d) for d in stored[...].tolist()]) if stored is not None
                     else np.full(n, "", dtype=object)).astype(str)
    return out
