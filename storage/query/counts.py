"""Mergeable counts on xarray: summed per group, divided once (a leaf: numpy, xarray and
`storage.query.statistics`; both `storage.query` and `storage.query.nulls` reduce with it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from storage.query.statistics import wilson_interval


def group_counts(counts: xr.Dataset, by: Sequence[str], keep: Sequence[str] = ()) -> xr.Dataset:
    """The data variables of `counts` (integer counts along a `cell` dim) summed per group of `by`
    (coordinates of the `cell` dim), as int64, along a `group` dim: one group per combination of
    `by` that occurs, in order of first appearance, the keys as coordinates on it. `keep` names
    coordinates of `cell` that are constant within each group (e.g. a layer's relative depth),
    carried along as variables. With `by` empty, one group: every cell."""
    by, keep, names = list(by), list(keep), list(counts.data_vars)
    values = counts.reset_coords(keep) if keep else counts
    if not by:
        total = values[names].sum("cell").assign({key: values[key].max("cell") for key in keep})
        return _as_int(total.expand_dims("group"), names)
    if not counts.sizes["cell"]:
        empty = {key: ("group", counts[key].values) for key in by}
        return values[names + keep].reset_coords(drop=True).rename(cell="group").assign_coords(
            empty)
    first = xr.DataArray(np.arange(counts.sizes["cell"]), dims="cell",
                         coords={key: counts[key] for key in by})
    grouped = values[names].groupby(by).sum()
    for key in keep:  # one value per group
        grouped[key] = values[key].groupby(by).max()
    grouped["first"] = first.groupby(by).min()  # NaN: a combination that never occurs
    stacked = grouped.stack(group=by)
    stacked = stacked.isel(group=np.flatnonzero(np.isfinite(stacked["first"].values)))
    stacked = stacked.sortby("first").drop_vars("first").reset_index("group")
    return _as_int(stacked.drop_vars("group", errors="ignore"), names)


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
