"""Read a sweep store as an `xarray.DataTree` and reduce its verdicts to holding rates.

Opening is lazy: result arrays become dask arrays over their Zarr chunks, and the attention
arrays are never opened. Rates are reductions of mergeable counts (sums over inputs, divided
once at the end), so partial and resumed sweeps report exactly what is done. The counting is
xarray's (`cell_counts` here, `group_counts` and `rates` in `storage.query.counts`); `holding_rates`
turns the result into a pandas table only at the end, for the report to render.

Why not `xr.open_datatree(store, engine="zarr")` alone: it does open a sweep store, to the same
values and without a warning once a run has consolidated the metadata (`tests/test_query.py`,
`tests/test_doc_snippets.py` keep it so), but mid-run it lists the root (warning on the `.sweep`
bookkeeping folder), it puts the verdicts one level down (`/<model>/results`), has no coordinates
(input ids, token-set names, relative depth come from the model's attrs), and a store whose
arrays do not match `storage.layout` fails deep inside xarray. `open_results` reads the writer's
list of models, checks every array's dims and shape against the layout (one-line InputError
naming the array), and builds the coordinates; it stays a thin layer over zarr + dask.
"""

from __future__ import annotations

from collections.abc import Sequence

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
import zarr

from storage.errors import InputError
from storage.layout import (
    BASELINE_GROUP,
    FORMAT,
    LEGACY_RESULT_DIMS,
    MEAN_HEAD,
    MODEL_VARS,
    NULLS_GROUP,
    OPTIONAL_RESULT_VARS,
    RESULT_VARS,
    RESULTS_GROUP,
    SLACK_WINDOW,
    ResultStatus,
    Var,
)
from storage.location import Location, StoreLike, locate
from storage.query.counts import group_counts, rates
from storage.query.nulls import baseline_dataset, matched_nulls_dataset
from storage.query.statistics import wilson_interval
from storage.query.tidy import model_names, tidy_cells

GROUP_KEYS = ("model", "input", "layer", "head", "token_set", "depth")
COUNT_COLUMNS = ("cells", "holding", "pending", "skipped", "disagreements")
"""What `cell_counts` sums per cell; `holding_rates` adds `inputs`, which is not a sum (an input
tested in two layers of a group counts once)."""


def open_results(store: StoreLike, storage_options: dict | None = None) -> xr.DataTree:
    """Open a sweep store lazily: one node per model (input, layer, head, token_set), below it
    a `nulls` node (null, token_set) of its size-matched nulls, and a baseline node (null, n).
    `head` is ["mean"] for a head-averaged model (and for a model group written before the head
    dimension), ["0", ..., "H-1"] for one that kept every head.

    `store`: a path, a URL (`s3://…`, with `storage_options`: `storage.location`) or a
    StoreRef. Reads results lazily (dask arrays), never attention.

    Raises InputError (one line) when `store` is missing or is not a dobrushin-sweep store.
    """
    location = locate(store, storage_options)
    path = location.ref.url
    root = _open_root(location)
    nodes: dict[str, xr.Dataset] = {"/": xr.Dataset(attrs=dict(root.attrs))}
    for name in root.attrs.get("models", []):  # the writer's list: no directory listing
        group = root.get(name)
        if not isinstance(group, zarr.Group):
            raise InputError(f"{path}: root attr models lists {name!r} but there is no such group")
        nodes[f"/{name}"] = _model_dataset(name, group, path)
        nulls = matched_nulls_dataset(group, path, name)
        if nulls is not None:
            nodes[f"/{name}/{NULLS_GROUP}"] = nulls
    baseline = root.get(BASELINE_GROUP)
    if isinstance(baseline, zarr.Group):
        nodes[f"/{BASELINE_GROUP}"] = baseline_dataset(baseline, path)
    return xr.DataTree.from_dict(nodes)


IN_MEMORY_BYTES = 1 << 30
"""The most result bytes `in_memory` reads into memory (1 GiB): a store's results up to that size
are read once, each array whole, and reduced by numpy; beyond it they stay lazy (dask, chunk by
chunk)."""


def in_memory(tree: xr.DataTree, budget: int = IN_MEMORY_BYTES) -> xr.DataTree:
    """`tree` with its nodes' variables read into memory while their bytes sum to at most
    `budget` (node by node, in order; the rest stay lazy): the same values, each array read once
    instead of once per reduction that uses it, and no dask graph per reduction."""
    nodes, left = {}, budget
    for node in tree.subtree:
        ds = node.to_dataset()
        if ds.nbytes <= left:
            ds, left = ds.compute(), left - ds.nbytes  # a copy: `tree` stays lazy
        nodes[node.path] = ds
    return xr.DataTree.from_dict(nodes)


def cells(store: StoreLike, storage_options: dict | None = None,
          models: Sequence[str] | None = None) -> xr.Dataset:
    """Every cell of a store across models as one lazy Dataset along `cell`
    (`storage.query.tidy.tidy_cells`): coordinates model, input, layer, relative_depth, head,
    token_set; every result variable and `n_tokens`. `store` and `storage_options` as for
    `open_results`; `models` picks some, in their order (default: all, in the store's order).

    `model` is a pandas categorical whose categories are the models in that order, so
    `.groupby("model")` keeps it (the store's: a model's checkpoints by epoch, then the model,
    then its control: `vit@seed0@epoch0`, `vit@seed0@epoch5`, `vit@seed0@epoch20`,
    `vit@seed0`, `vit@seed0@random-init`) rather than sorting the names as text."""
    tree = open_results(store, storage_options)
    order = model_names(tree) if models is None else list(dict.fromkeys(models))
    tidy = tidy_cells(tree, order)
    return tidy.assign_coords(model=("cell", pd.Categorical(tidy["model"].values,
                                                            categories=order)))


def holding_rates(
    tree: xr.DataTree,
    by: Sequence[str] = ("model", "layer", "token_set"),
    tol: float | None = None,
    depth_bins: int = 3,
) -> pd.DataFrame:
    """Tidy table of holding rates: one row per group of `by`, counts summed before dividing.

    `by`: any of model, input (the input id: an input of several models is one group), layer,
    head, token_set, depth (the bin index of relative depth in `depth_bins` equal bins).
    Columns: the `by` keys (plus `relative_depth` when grouping by model and layer, and
    `depth_low`/`depth_high` when grouping by `depth`), then `inputs` (distinct inputs with at
    least one tested cell in the group, an input of each model counted apart), `cells` (cells
    tested: status OK), `holding` (of those cells), `rate` = holding / cells, `ci_low`,
    `ci_high` (95% Wilson over cells), `pending` (not computed yet), `skipped` (empty row / too
    small) and `disagreements` (OK cells whose stored verdict and characterisation differ;
    expected 0). A cell is one matrix: (input, layer) for a head-averaged model, (input, layer,
    head) for one that kept every head.
    `tol` (<= SLACK_WINDOW) re-applies a tolerance to every stored verdict: holds := margin <=
    tol, holds_by_characterisation := slack <= tol (so disagreements are recounted too).
    """
    if "input" in by:
        _check_by(by, depth_bins)
        return rates_from_cells(input_cell_counts(tree, tol), by, depth_bins)
    return rates_from_cells(cell_counts(tree, tol), by, depth_bins)


def rates_from_cells(
    cells: xr.Dataset, by: Sequence[str] = ("model", "layer", "token_set"), depth_bins: int = 3
) -> pd.DataFrame:
    """`holding_rates` from `cell_counts` (or `input_cell_counts`): compute the counts once,
    group them many ways.

    The counts are summed per group by xarray (`group_counts`) and divided once (`rates`); the
    result becomes a table only here, for the report to render.
    """
    by = _check_by(by, depth_bins)
    if "input" in by and "input" not in cells.coords:
        raise InputError("cannot group these counts by input: they are summed over inputs "
                         "(use input_cell_counts)")
    cells = cells.assign_coords(
        depth=("cell", depth_bin(cells["relative_depth"].values, depth_bins)))
    layers = "model" in by and "layer" in by  # one relative depth per group: the layer's own
    groups = group_counts(cells[list(COUNT_COLUMNS)], by, keep=["relative_depth"] if layers else [])
    columns = {key: groups[key].values for key in by}
    columns["inputs"] = distinct_inputs(cells, by, groups)
    columns.update({name: groups[name].values for name in COUNT_COLUMNS})
    if layers:
        columns["relative_depth"] = groups["relative_depth"].values
    if "depth" in by:
        columns["depth_low"] = groups["depth"].values / depth_bins
        columns["depth_high"] = (groups["depth"].values + 1) / depth_bins
    columns.update({name: values.values for name, values in rates(
        groups["holding"], groups["cells"]).items()})
    return pd.DataFrame(columns)


def _check_by(by: Sequence[str], depth_bins: int) -> list[str]:
    by = list(dict.fromkeys(by))
    unknown = [key for key in by if key not in GROUP_KEYS]
    if unknown:
        raise InputError(f"cannot group holding rates by {unknown}: choose from {list(GROUP_KEYS)}")
    if depth_bins < 1:
        raise InputError(f"depth_bins must be a positive integer, got {depth_bins}")
    return by


def distinct_inputs(cells: xr.Dataset, by: Sequence[str], groups: xr.Dataset) -> np.ndarray:
    """Per group of `groups` (from `group_counts(cells, by)`): the inputs with at least one
    tested cell in it, an input of each model counted apart. From `tested` (cell, slot) of
    `cell_counts`, or from per-input cells (an `input` coordinate: `input_cell_counts`)."""
    per_input = "input" in cells.coords
    keys = list(dict.fromkeys(["model", *by, *(["input"] if per_input else [])]))
    frame = pd.DataFrame({key: cells[key].values for key in keys})
    found: dict[tuple, int] = {}
    tested = cells["cells"].values > 0 if per_input else cells["tested"].values
    for sub, rows in frame.groupby(keys, sort=False, dropna=False).indices.items():
        sub = sub if isinstance(sub, tuple) else (sub,)
        at = dict(zip(keys, sub, strict=True))
        count = int(tested[rows].any()) if per_input else int(tested[rows].any(axis=0).sum())
        group = tuple(at[key] for key in by)
        found[group] = found.get(group, 0) + count
    return np.array([found.get(tuple(groups[key].values[i] for key in by), 0)
                     for i in range(groups.sizes["group"])], dtype=np.int64)


def cell_counts(tree: xr.DataTree, tol: float | None = None) -> xr.Dataset:
    """Counts per (model, layer, head, token_set) along one `cell` dim (coordinates model,
    layer, head, token_set, relative_depth): OK cells, holding among them, pending, skipped,
    disagreements, each summed over the inputs by xarray; and `tested` (cell, slot): whether
    the model's input at position `slot` has a verdict there (False beyond its inputs), from
    which `distinct_inputs` counts inputs."""
    tol = check_tol(tol)
    names = model_names(tree)
    computed = dask.compute(*[(_counts(tree[name].to_dataset(), tol),
                               ok(tree[name].to_dataset())) for name in names])
    slots = max((int(done.sizes["input"]) for _, done in computed), default=0)
    cells = []
    for name, (counts, done) in zip(names, computed, strict=True):
        stacked = counts.stack(cell=("layer", "head", "token_set")).reset_index("cell")
        size = stacked.sizes["cell"]
        tested = np.zeros((size, slots), dtype=bool)
        tested[:, :done.sizes["input"]] = done.transpose(
            "layer", "head", "token_set", "input").values.reshape(size, -1)
        cells.append(stacked.assign_coords(model=("cell", np.full(size, name, dtype=object)))
                     .assign(tested=(("cell", "slot"), tested)))
    if not cells:
        empty = {key: ("cell", np.array([], dtype=dtype)) for key, dtype in (
            ("model", object), ("layer", np.int64), ("head", object), ("token_set", object),
            ("relative_depth", np.float64))}
        return xr.Dataset({name: ("cell", np.array([], dtype=np.int64)) for name in COUNT_COLUMNS}
                          | {"tested": (("cell", "slot"), np.zeros((0, 0), dtype=bool))},
                          coords=empty)
    cells = xr.concat(cells, dim="cell")
    return cells.assign({name: cells[name].astype(np.int64) for name in COUNT_COLUMNS})


def input_cell_counts(tree: xr.DataTree, tol: float | None = None) -> xr.Dataset:
    """`cell_counts` without the sum over inputs: one `cell` per (model, input, layer, head,
    token_set) (`storage.query.tidy.tidy_cells`), each count 0 or 1; for grouping by input."""
    tol = check_tol(tol)
    tidy = tidy_cells(tree)
    if not tidy.sizes.get("cell", 0):
        return tidy.assign({name: ("cell", np.array([], dtype=np.int64))
                            for name in COUNT_COLUMNS})
    counts = _indicators(tidy, tol).compute()
    return counts.assign({name: counts[name].astype(np.int64) for name in COUNT_COLUMNS})


def holds(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """Verdict per cell: the stored `holds`, or `margin <= tol` when a tolerance is given."""
    return ds["holds"] if tol is None else ds["margin"] <= tol


def holds_by_characterisation(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """The characterisation per cell: stored, or `slack <= tol` when a tolerance is given."""
    return ds["holds_by_characterisation"] if tol is None else ds["slack"] <= tol


def attaining_special(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """Whether every attaining pair involves a special token: stored, or `content_gap > tol`
    when a tolerance is given (pairs within tol of kappa attain)."""
    return ds["attaining_special"] if tol is None else ds["content_gap"] > tol


def ok(ds: xr.Dataset) -> xr.DataArray:
    """Cells whose test has run and produced a verdict (status OK)."""
    return ds["status"] == ResultStatus.OK


def with_rates(table: pd.DataFrame, k: str, n: str, prefix: str = "") -> pd.DataFrame:
    """Add `rate`, `ci_low`, `ci_high` (95% Wilson) for `table[k]` out of `table[n]`.

    With no trials the rate is NaN and the interval (0, 1), as `workers.nulls.baseline` defines it.
    """
    table = table.copy()
    counts, totals = table[k].to_numpy(np.int64), table[n].to_numpy(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        table[f"{prefix}rate"] = counts / totals
    bounds = [wilson_interval(int(a), int(b)) for a, b in zip(counts, totals, strict=True)]
    low, high = np.array(bounds, dtype=np.float64).reshape(-1, 2).T
    table[f"{prefix}ci_low"], table[f"{prefix}ci_high"] = low, high
    return table


def depth_bin(relative_depth: np.ndarray, bins: int) -> np.ndarray:
    """Index of the equal-width relative-depth bin (0 = first, bins - 1 holds depth 1)."""
    index = np.floor(np.asarray(relative_depth, dtype=np.float64) * bins + 1e-9)
    return np.clip(index, 0, bins - 1).astype(np.int64)


def check_tol(tol: float | None) -> float | None:
    """`tol` as a float, or InputError unless it is None or a finite number in [0, W]: the
    stored slack and content_gap decide the verdicts exactly only up to W = SLACK_WINDOW."""
    if tol is None:
        return None
    value = float(tol)
    if not np.isfinite(value) or value < 0:
        raise InputError(f"tolerance must be a non-negative finite number, got {tol!r}")
    if value > SLACK_WINDOW:
        raise InputError(
            f"tolerance {value:g} is above {SLACK_WINDOW:g}, the window within which the stored "
            "slack and content_gap are exact: re-run the test stage with that tol instead"
        )
    return value


def _indicators(ds: xr.Dataset, tol: float | None) -> xr.Dataset:
    """Per cell of `ds`: whether it is tested (`cells`), holds, is pending, skipped, or a
    disagreement; the counts `COUNT_COLUMNS` before any sum."""
    status = ds["status"]
    done = ok(ds)
    return xr.Dataset({
        "cells": done,
        "holding": done & holds(ds, tol),
        "pending": status == ResultStatus.NOT_COMPUTED,
        "skipped": ~done & (status != ResultStatus.NOT_COMPUTED),
        "disagreements": done & (holds(ds, tol) != holds_by_characterisation(ds, tol)),
    })


def _counts(ds: xr.Dataset, tol: float | None) -> xr.Dataset:
    return _indicators(ds, tol).sum("input")


def _open_root(location: Location) -> zarr.Group:
    path = location.ref.url
    if location.read("zarr.json") is None:
        if location.any_key(""):
            raise InputError(f"{path} is not a Zarr v3 sweep store (it holds no zarr.json)")
        raise InputError(f"no sweep store at {path}: check the path or run `sweep run` first")
    try:
        root = zarr.open_group(location.zarr_store(read_only=True), mode="r",
                               use_consolidated=False)
    except (FileNotFoundError, ValueError, TypeError, KeyError) as error:
        raise InputError(f"{path} is not a Zarr v3 sweep store ({error})") from error
    found = root.attrs.get("format")
    if found != FORMAT:
        raise InputError(
            f"{path} is not a dobrushin-sweep store: root attr format is {found!r}, "
            f"expected {FORMAT!r}"
        )
    return root


def _array(group: zarr.Group, name: str, spec: Var, where: str) -> zarr.Array:
    array = group.get(name)
    if not isinstance(array, zarr.Array):
        raise InputError(f"{where}/{name} is missing: the store is incomplete or not a sweep store")
    dims = tuple(array.metadata.dimension_names or ())
    if dims != spec.dims:
        raise InputError(f"{where}/{name} has dimension_names {dims}, expected {spec.dims}")
    return array


def _model_dataset(name: str, group: zarr.Group, path: str) -> xr.Dataset:
    where = f"{path}/{name}"
    attrs = dict(group.attrs)
    missing = [key for key in ("n_layers", "token_sets") if key not in attrs]
    if missing:
        raise InputError(f"{where} lacks the model attrs {missing}: not a sweep model group")
    results = group.get(RESULTS_GROUP)
    if not isinstance(results, zarr.Group):
        raise InputError(f"{where}/{RESULTS_GROUP} is missing: the store is incomplete")
    ids = _array(group, "input_id", MODEL_VARS["input_id"], where)[...]
    input_id = np.array([str(i) for i in ids.tolist()], dtype=object)
    n_layers, token_sets = int(attrs["n_layers"]), [str(t) for t in attrs["token_sets"]]
    legacy = "head" not in group  # written before the head dimension: one head-averaged map
    if legacy:
        head = np.array([MEAN_HEAD], dtype=object)
    else:
        labels = _array(group, "head", MODEL_VARS["head"], where)[...]
        head = np.array([str(h) for h in labels.tolist()], dtype=object)
    expected = (input_id.shape[0], n_layers, len(head), len(token_sets))
    data_vars = {}
    for var, spec in RESULT_VARS.items():
        if var in OPTIONAL_RESULT_VARS and var not in results:
            continue  # written before the variable existed
        stored = Var(LEGACY_RESULT_DIMS, spec.dtype, spec.fill, spec.doc) if legacy else spec
        array = _array(results, var, stored, f"{where}/{RESULTS_GROUP}")
        values = da.from_zarr(array, chunks=array.shards or array.chunks)  # compacted:
        # one dask chunk per object
        if legacy:
            values = values[:, :, None, :]  # (input, layer, head, token_set): the mean head
        if values.shape != expected:
            raise InputError(
                f"{where}/{RESULTS_GROUP}/{var} has shape {array.shape}, expected {expected} "
                "(inputs, n_layers, heads, token_sets) from input_id, head and the model attrs"
            )
        data_vars[var] = (spec.dims, values)
    n_tokens = _array(group, "n_tokens", MODEL_VARS["n_tokens"], where)
    data_vars["n_tokens"] = (MODEL_VARS["n_tokens"].dims, da.from_zarr(n_tokens))
    layer = np.arange(n_layers)
    relative_depth = layer / (n_layers - 1) if n_layers > 1 else np.zeros(n_layers)
    coords = {
        "input": input_id,
        "layer": layer,
        "relative_depth": ("layer", relative_depth),
        "head": head,
        "token_set": token_sets,
    }
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)
