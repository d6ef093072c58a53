"""Read the nulls of a sweep store: the config-size baseline and each model's size-matched nulls.

Both are per-chunk counts; a chunk whose `holding` is still -1 is not done and counts nothing.
Rates are the summed counts divided once (`storage.query.counts.rates`), with 95% Wilson intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
import zarr

from storage.errors import InputError
from storage.layout import (
    BASELINE_GROUP,
    BASELINE_VARS,
    LEGACY_BASELINE_DIMS,
    MATCHED_VARS,
    NULLS_GROUP,
    Var,
)
from storage.query.counts import rates

LEGACY_NULL = "uniform"  # what a store from before named nulls holds (the same stream)


def _array(group: zarr.Group, name: str, spec: Var, where: str,
           legacy: tuple[str, ...] | None = None) -> zarr.Array:
    array = group.get(name)
    if not isinstance(array, zarr.Array):
        raise InputError(f"{where}/{name} is missing: the store is incomplete or not a sweep store")
    dims = tuple(array.metadata.dimension_names or ())
    if dims != spec.dims and dims != legacy:
        raise InputError(f"{where}/{name} has dimension_names {dims}, expected {spec.dims}")
    return array


def _counts(holding: np.ndarray, trials: np.ndarray, disagreements: np.ndarray,
            dims: tuple[str, str]) -> xr.Dataset:
    """Sums over the last (chunk) axis of the finished chunks (holding >= 0), along `dims`:
    trials, holding, disagreements, chunks_done, chunks, then rate and its 95% Wilson interval
    (`storage.query.counts.rates`)."""
    per_chunk = xr.Dataset({name: ((*dims, "chunk"), values) for name, values in (
        ("trials", trials), ("holding", holding), ("disagreements", disagreements))})
    done = per_chunk["holding"] >= 0
    table = per_chunk.where(done, 0).sum("chunk").assign(
        chunks_done=done.sum("chunk"),
        chunks=xr.full_like(done.sum("chunk"), done.sizes["chunk"], dtype=np.int64))
    return table.merge(rates(table["holding"], table["trials"]))


def baseline_dataset(group: zarr.Group, path: str) -> xr.Dataset:
    """The baseline node: dims (null, n); trials, holding, disagreements, chunks_done, chunks,
    rate, ci_low, ci_high. A pre-nulls store's (size, chunk) arrays read as null `uniform`."""
    where = f"{path}/{BASELINE_GROUP}"
    names = ("holding", "trials", "disagreements")
    arrays = {var: _array(group, var, BASELINE_VARS[var], where, LEGACY_BASELINE_DIMS)[...]
              for var in names}
    n = _array(group, "n", BASELINE_VARS["n"], where)[...]
    if arrays["holding"].ndim == 2:  # written before named nulls
        nulls = np.array([LEGACY_NULL], dtype=object)
        arrays = {var: values[None] for var, values in arrays.items()}
    else:
        nulls = np.array([str(v) for v in _array(group, "null", BASELINE_VARS["null"], where)[...]
                          .tolist()], dtype=object)
    table = _counts(arrays["holding"], arrays["trials"], arrays["disagreements"], ("null", "n"))
    return table.assign_coords(null=nulls, n=n).assign_attrs(group.attrs)


def matched_nulls_dataset(model: zarr.Group, path: str, name: str) -> xr.Dataset | None:
    """A model's size-matched nulls: dims (null, token_set), the same variables as the baseline
    node; None when the model group has no nulls."""
    group = model.get(NULLS_GROUP)
    if not isinstance(group, zarr.Group):
        return None
    where = f"{path}/{name}/{NULLS_GROUP}"
    arrays = {var: _array(group, var, MATCHED_VARS[var], where)[...]
              for var in ("holding", "trials", "disagreements")}
    nulls = np.array([str(v) for v in _array(group, "null", MATCHED_VARS["null"], where)[...]
                      .tolist()], dtype=object)
    token_sets = [str(t) for t in group.attrs.get("token_sets", [])]
    if arrays["holding"].shape[:2] != (len(nulls), len(token_sets)):
        raise InputError(f"{where}/holding has shape {arrays['holding'].shape}, expected "
                         f"({len(nulls)}, {len(token_sets)}, chunks) from its null and attrs")
    table = _counts(arrays["holding"], arrays["trials"], arrays["disagreements"],
                    ("null", "token_set"))
    return table.assign_coords(null=nulls, token_set=token_sets).assign_attrs(group.attrs)


def matched_null_table(tree: xr.DataTree, models: list[str]) -> pd.DataFrame:
    """Tidy records of every model's size-matched nulls: model, token_set, null, trials, holding,
    rate, ci_low, ci_high, disagreements, chunks_done, chunks."""
    columns = ["model", "token_set", "null", "trials", "holding", "rate", "ci_low", "ci_high",
               "disagreements", "chunks_done", "chunks"]
    frames = []
    for name in models:
        if NULLS_GROUP not in tree[name].children:
            continue
        ds = tree[name][NULLS_GROUP].to_dataset()  # token_set is inherited from the model node
        ds = ds.drop_vars([c for c in ds.coords if c not in ("null", "token_set")])
        frame = ds.to_dataframe().reset_index()
        frames.append(frame.assign(model=name))
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]
