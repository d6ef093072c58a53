"""Mergeable counts on xarray: summed per group, divided once (a leaf: numpy, pandas, xarray
and `storage.query.statistics`; both `storage.query` and `storage.query.nulls` reduce with it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from storage.query.statistics import wilson_interval


def group_counts(counts: xr.Dataset, by: Sequence[str], keep: Sequence[str] = ()) -> xr.Dataset:
    """The data variables of `counts` (integer counts along a `cell` dim) summed per group of `by`
    (coordinates of the `cell` dim), as int64, along a `group` dim: one group per combination of
    `by` that occurs, in order of first appearance, the keys as coordinates on it. `keep` names
    coordinates of `cell` that are constant within each group (e.g. a layer's relative depth),
    carried along as variables. With `by` empty, one group: every cell.

    Vectorised: each cell's group from one factorisation of the keys (pandas), each sum one
    `np.bincount` (exact: counts below 2^53)."""
    by, keep, names = list(by), list(keep), list(counts.data_vars)
    values = counts.reset_coords(keep) if keep else counts
    if not by:
        total = values[names].sum("cell").assign({key: values[key].max("cell") for key in keep})
        return _as_int(total.expand_dims("group"), names)
    if not counts.sizes["cell"]:
        empty = {key: ("group", counts[key].values) for key in by}
        return values[names + keep].reset_coords(drop=True).rename(cell="group").assign_coords(
            empty)
    keys = pd.DataFrame({key: np.asarray(counts[key].values) for key in by})
    group = keys.groupby(by, sort=False).ngroup().fillna(-1).to_numpy(np.int64)  # -1: NaN key
    kept = group >= 0
    group = group[kept]
    n_groups = int(group.max()) + 1 if group.size else 0
    first = np.flatnonzero(kept)[np.unique(group, return_index=True)[1]]  # each group's first
    data = {name: ("group", np.bincount(group, weights=np.asarray(values[name].values)[kept],
                                        minlength=n_groups)) for name in names}
    for key in keep:  # one value per group
        data[key] = ("group", pd.Series(np.asarray(values[key].values)[kept]).groupby(
            group).max().to_numpy())
    coords = {key: ("group", keys[key].to_numpy()[first]) for key in by}
    return _as_int(xr.Dataset(data, coords=coords), names)


def rates(k: xr.DataArray, n: xr.DataArray) -> xr.Dataset:
    """`rate` = k / n with its 95% Wilson interval (`ci_low`, `ci_high`), elementwise: counts
    divided once. With no trials the rate is NaN and the interval (0, 1), as
    `workers.nulls.baseline` defines it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = k.astype(np.float64) / n
    low, high = xr.apply_ufunc(
        lambda a, b: wilson_interval(int(a), int(b)), k, n, vectorize=True,
        output_core_dims=[[], []], output_dtypes=[np.float64, np.float64],
    )
    return xr.Dataset({"rate": rate, "ci_low": low, "ci_high": high})


def _as_int(ds: xr.Dataset, names: list[str]) -> xr.Dataset:
    """`ds` with the count variables `names` as int64 (groupby sums may be floats)."""
    return ds.assign({name: ds[name].astype(np.int64) for name in names})
