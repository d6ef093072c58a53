"""Every cell of a results tree, across models, as one xarray Dataset along one `cell` dim.

A cell is one tested matrix: (model, input, layer, head, token_set). Models differ in their
inputs (their own datasets), layers and heads, so a dense (model, input, layer, head, token_set)
cube would be mostly padding that reads as "not computed"; the honest shape is one `cell` dim,
flattened model by model in the order (input, layer, head, token_set), with the keys as
coordinates on it. The verdict variables stay lazy (dask, one chunk per stored chunk of
inputs); the coordinates are in memory (numpy, 8 bytes a cell each), so that xarray can group by
them (`ds.groupby(["model", "token_set"])`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from storage.errors import InputError
from storage.layout import BASELINE_GROUP, RESULT_DIMS

KEYS = ("model", "input", "layer", "relative_depth", "head", "token_set")
"""The coordinates along `cell`, besides the verdict variables and `n_tokens`."""


def model_names(tree: xr.DataTree) -> list[str]:
    """Names of the model nodes of a tree from `open_results`, in the store's `models` order."""
    return [name for name in tree.children if name != BASELINE_GROUP]


def tidy_cells(tree: xr.DataTree, models: Sequence[str] | None = None) -> xr.Dataset:
    """One Dataset along `cell` (model by model; input, layer, head, token_set within), lazy
    in its variables: every result variable, `n_tokens` of the cell's input, and the
    coordinates `KEYS`. `models` (default: every model, in the store's order) picks some.

    Cells whose test has not run are there (status -1): a partial store shows what is pending.
    """
    names = model_names(tree)
    chosen = names if models is None else list(dict.fromkeys(models))
    unknown = [name for name in chosen if name not in names]
    if unknown:
        raise InputError(f"no model {unknown[0]!r} in the store: choose from {names}")
    parts = [_model_cells(name, tree[name].to_dataset()) for name in chosen]
    if not parts:
        return xr.Dataset(coords={key: ("cell", np.array([], dtype=dtype)) for key, dtype in (
            ("model", object), ("input", object), ("layer", np.int64),
            ("relative_depth", np.float64), ("head", object), ("token_set", object))})
    return xr.concat(parts, dim="cell", data_vars="all", coords="different", compat="equals",
                     join="outer", combine_attrs="drop")


def _model_cells(name: str, ds: xr.Dataset) -> xr.Dataset:
    """One model's cells along `cell`: its (input, layer, head, token_set) flattened in C order."""
    shape = tuple(ds.sizes[dim] for dim in RESULT_DIMS)
    size = int(np.prod(shape))
    variables = {}
    for var, values in ds.data_vars.items():
        if values.dims == RESULT_DIMS:
            data = values.data
        else:  # n_tokens (input,): the same for every cell of the input
            data = values.expand_dims({d: ds.sizes[d] for d in RESULT_DIMS[1:]}, axis=[1, 2, 3])
            data = data.transpose(*RESULT_DIMS).data
        if hasattr(data, "rechunk"):  # dask: whole trailing dims, so the reshape is a view
            data = data.rechunk({1: -1, 2: -1, 3: -1})
        variables[var] = ("cell", data.reshape(size))
    grid = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    at = dict(zip(RESULT_DIMS, (axis.reshape(size) for axis in grid), strict=True))
    coords = {
        "model": ("cell", np.full(size, name, dtype=object)),
        "input": ("cell", ds["input"].values.astype(object)[at["input"]]),
        "layer": ("cell", ds["layer"].values[at["layer"]].astype(np.int64)),
        "relative_depth": ("cell", ds["relative_depth"].values[at["layer"]]),
        "head": ("cell", ds["head"].values.astype(object)[at["head"]]),
        "token_set": ("cell", ds["token_set"].values.astype(object)[at["token_set"]]),
    }
    return xr.Dataset(variables, coords=coords)
